"""The columnar layer: Parquet and JSON lines read as Arrow record batches that say where
their rows came from; columns mapped to spec leaves, decoded, batched and encoded."""
