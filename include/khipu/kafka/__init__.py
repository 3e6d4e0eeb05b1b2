"""Khipu's one Kafka layer: typed connection settings (secrets apart) and the admin wrapper."""

from khipu.kafka.admin import GroupDescription, KafkaAdmin, TopicRetention
from khipu.kafka.connection import KafkaConnection, KafkaConnectionError, KafkaUnavailable, Secret

__all__ = [
    "GroupDescription",
    "KafkaAdmin",
    "KafkaConnection",
    "KafkaConnectionError",
    "KafkaUnavailable",
    "Secret",
    "TopicRetention",
]
