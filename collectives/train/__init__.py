"""The MNIST trainer (``python -m collectives.train``): data-parallel SGD on our collectives.

* :mod:`.cli`: arguments and the checks made before any rank starts;
* :mod:`.loop`: one rank's job, the training loop and evaluation;
* :mod:`.schedule`: the learning-rate schedule;
* :mod:`.checkpoint`: atomic writes, checkpoints and the resume policy;
* :mod:`.lock`: one training per ``--out``;
* :mod:`.curves`: metrics and the loss/accuracy picture;
* :mod:`.data`, :mod:`.models`: MNIST and the CNN.
"""
