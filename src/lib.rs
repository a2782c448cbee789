pub mod batch;
pub mod config;
pub mod error;
pub mod tensor;
