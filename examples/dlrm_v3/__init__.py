"""DLRM-v3 (HSTU) for issue 68: our PyTorch reference of MLPerf Inference's generative
recommender (model.py) and its synthetic request generator (data.py). docs/dlrm-v3.md says
what the reference is and where each fact about it was read."""
