"""Specs and their validation, the plans (``Plan``, ``PackedPlan``) and their batches
(``PaddedBatch``; ``PackedBatch``, laid out by the ``Packer``), the output contract, dead
letters and the tree codec: numpy, no compiler, no Beam, so it tests in milliseconds.
"""
