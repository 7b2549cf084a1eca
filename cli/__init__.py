"""The ``kstore`` admin command (typer): topics, console producer and consumer, consumer
groups and verification of a store, as Kafka's command-line tools do for a cluster.

Importing this package is cheap: the command modules import the kstore core (pyarrow, fsspec,
s3fs) only inside the commands that need it.
"""
