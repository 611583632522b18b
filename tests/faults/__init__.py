"""The fault suite: servers stopped, killed and restarted under load; it runs last (conftest.py).

- `support`: what its tests share. `test_*`: one kind of fault each.
"""
