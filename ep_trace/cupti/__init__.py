"""In-process CUPTI activity collector (extra ``cupti``). Importing this package never needs a GPU."""
