"""What makes this machine fast, measured rather than assumed; torch is imported only when a function runs
(`linear`, `int8_attention`, `int8_linear` and `layernorm_quant` excepted: they define torch ops).

    cpu         this CPU's flags and host class (AVX2 / AVX-512 / AVX-512+VNNI / AMX), the one /proc/cpuinfo reader,
                and the one summary of the machine a result was measured on (`machine_summary`)
    autotune    measured choices cached per machine ($VITLAB_CACHE/autotune.json)
    precision   `precision: auto` (fp32 or bf16, measured), autocast, and vitlab's one timer (`time_rounds`)
    linear      row-major weight-gradient GEMMs for compiled bf16 training on AMX (`rowmajor_weight_grads`)
    onednn      oneDNN's biased GEMM and GELU for compiled bf16 training without AMX (`onednn_training_kernels`)
    allocator   glibc malloc tuning that keeps freed training memory (`keep_freed_memory`)
    int8_attention, int8_linear, layernorm_quant
                vitlab's own C++ kernels for static int8 on AVX-512 (fused int8 attention; the int8 GEMM with its
                epilogues; LayerNorm + quantise), torch ops built and registered on first use by `native`
"""
