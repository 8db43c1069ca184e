//! The async REST client (filled in by the CLI work).
