"""The keyed speed layer: Kafka -> the per-partition processor (Spark executors) -> Redis.

- :mod:`contract.redis_functions`: the state machine of the views, run inside Redis
  (fan-out, refills, fences, dedup, changelog), loaded and versioned by :mod:`.functions`;
- :mod:`pipelines.speed.processor`: records of one partition -> contract check -> Redis;
- :mod:`pipelines.speed.stream`: the Spark Structured Streaming query that runs the processor
  over the Kafka partitions in offset order, starting from the fences Redis holds.
"""
