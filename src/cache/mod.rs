//! CPU-side KV cache memory management (block allocators, block tables, sharing,
//! copy-on-write, swapping, prefix caching). Filled in by the KV cache manager work.
