"""SFT stage: token losses (``sft.losses``), the chunked loss head (``sft.token_stats``) and the FSDP2 trainer."""
