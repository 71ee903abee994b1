"""numbakv.integrations: other libraries' models served through numbakv's caches.

transformers   `TransformersModel` (a Hugging Face causal LM whose every attention layer
               goes through a numbakv cell cache) and `cache_config` (the cache that fits
               an HF config, or a refusal of what numbakv does not implement). Needs the
               extra `numbakv[transformers]`: torch and transformers are imported only there.
"""
