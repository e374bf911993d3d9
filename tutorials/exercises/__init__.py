"""Exercises: write a collective from point-to-point messages, then grade it.

Each file here holds one exercise: a docstring (what to build, the chapter to
read, a hint, the traffic to reach) and a function with torch.distributed's
signature whose body raises NotImplementedError. Write the body, then::

    python -m tutorials.exercises.grade all_reduce

``solutions/`` holds a reference solution for each; ``wrong/`` holds wrong
ones, each graded by the tests to prove the grader's verdicts.
"""
EXERCISES = ["send_recv_ring", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce",
             "all_to_all", "average_gradients", "zero1_step", "sim_all_reduce"]
EXERCISES += ["tensor_parallel_mlp", "moe_dispatch"]   # chapters 17 and 19
EXERCISES += ["pipeline_1f1b", "fsdp_step"]   # chapters 16 and 18
EXERCISES += ["ring_attention", "ring_attention_zigzag"]   # chapter 20
