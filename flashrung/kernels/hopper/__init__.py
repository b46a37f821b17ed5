"""The sm_90a (Hopper) flagship kernels: TMA, wgmma, warp specialization, in Gluon.

``fwd``      the attention forward (``hopper.fwd`` in the dispatch table)
``config``   its frozen configuration and ``select_config(problem)``
``pipeline`` ring slots, phase parity, the consumer turn token
``schedule`` tile order (LPT, persistent), K/V tile ranges, causal mask extents
``softmax``  the scale fold, online update, fully-masked-row guard, LSE
``selfcheck`` ``python -m flashrung.kernels.hopper.selfcheck``: correctness and timing on an H200
"""
