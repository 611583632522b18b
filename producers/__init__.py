"""The write path: the event contract, the Kafka SDK and the publish CLI."""
