"""HF's strategy arguments on Lightning strategies: the default FSDP2 sharding (`fsdp2.py`), the strategies
(`strategies.py`) and what an update does differently under each (`runtime.py`)."""
