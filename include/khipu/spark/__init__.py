"""Khipu's Spark adapters: the Kafka stream source for clusters without Spark's JVM connector."""
