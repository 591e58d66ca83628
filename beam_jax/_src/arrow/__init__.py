"""The columnar layer: Arrow columns mapped to spec leaves, decoded, batched and encoded."""
