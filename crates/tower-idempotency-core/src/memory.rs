//! The in-memory store. (Being written.)

/// Placeholder.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore;

/// Placeholder.
#[derive(Debug, Clone, Default)]
pub struct MemoryStoreConfig;
