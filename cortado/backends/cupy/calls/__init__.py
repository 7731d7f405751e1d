"""The calls the GPU's runners make, each built from a small frozen description of what it computes (shapes, dtypes,
element strides, options; no IR term): cuBLASLt's GEMMs (``cublaslt``: ``GemmCall``), cuDNN's convolutions
(``cudnn_conv``: ``ConvCall``, timed against im2col and GEMMs in ``conv_im2col``, our weight-gradient kernel in
``conv_wgrad``, the call in NCHW between copies in ``conv_nchw``, and an epilogue kernel after it in
``conv_epilogue``), cuDNN's flash attention (``cudnn_attention``: ``AttentionCall``) and our int8 tensor-core
kernels beside cuBLASLt's (``int8``: ``Int8Call``). The targets (``targets/``) make the descriptions from the plan's
terms; a call never sees a term, so it can be built and timed on its own (the benchmarks do).
"""
