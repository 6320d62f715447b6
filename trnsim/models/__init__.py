"""Models, not the simulator: the small Llama that the demos, notebooks and benchmarks
time (:mod:`trnsim.models.tinyllama`), and tiny configurations of Hugging Face
architectures with the sweep that runs them on the device
(:mod:`trnsim.models.hf_coverage`, which imports transformers)."""
