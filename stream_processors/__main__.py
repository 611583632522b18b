"""`python -m stream_processors`: run one projector worker with the LEDGER_* settings."""

from stream_processors.worker import run

if __name__ == "__main__":
    run()
