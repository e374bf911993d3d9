"""Parallelism built only from our collectives and the door: data parallel (the naive way and
DDP's buckets), ZeRO-1/2, SyncBatchNorm, and a DDP communication hook."""
