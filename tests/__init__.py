"""The test suite against the real servers: test_* modules; `support`: what they share; `faults`: the fault suite."""
