"""Data: records from files, chat rendering with loss masks, packing into token-budget batches."""
