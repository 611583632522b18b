"""`producers.retry.retry`, the one bounded retry (the Kafka cluster's admin calls, the positioned projections'
deadlocked batches): how many calls, which errors, how long apart, what is raised at the end."""

from __future__ import annotations

import pytest

from producers import retry as retry_module
from producers.retry import retry

pytestmark = pytest.mark.unit


class Flaky:
    """Fails with `error` on the first `failures` calls, then answers its call count."""

    def __init__(self, failures: int, error: type[BaseException] = ConnectionError) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"call {self.calls}")
        return self.calls


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(retry_module.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize("failures", [0, 1, 4])
def test_a_transient_error_is_retried_with_a_linear_back_off(failures, sleeps):
    seen: list[tuple[str, int]] = []
    got = retry(
        Flaky(failures),
        attempts=5,
        retry_on=(ConnectionError,),
        step_s=0.2,
        on_retry=lambda exc, attempt: seen.append((str(exc), attempt)),
    )
    assert got == failures + 1
    assert sleeps == pytest.approx([0.2 * a for a in range(1, failures + 1)])
    assert seen == [(f"call {a}", a) for a in range(1, failures + 1)]


@pytest.mark.parametrize("attempts", [1, 2, 5])
def test_after_the_last_attempt_its_error_is_raised(attempts, sleeps):
    flaky = Flaky(attempts + 3)
    with pytest.raises(ConnectionError, match=f"call {attempts}$"):
        retry(flaky, attempts=attempts, retry_on=(ConnectionError,), step_s=0.05)
    assert flaky.calls == attempts and len(sleeps) == attempts - 1


def test_any_other_error_is_raised_at_once(sleeps):
    flaky = Flaky(1, error=ValueError)
    with pytest.raises(ValueError):
        retry(flaky, attempts=5, retry_on=(ConnectionError,), step_s=0.2)
    assert flaky.calls == 1 and sleeps == []
