"""A channel's queue: its messages, deliveries, acknowledgements and pull requests."""
