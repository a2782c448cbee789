//! The list of engine kinds this build of the backend serves, in the order a model file is
//! looked for when the config names no engine. Each engine crate offers its kind (its
//! claim and its load); adding an engine is its crate and one line here.

use triton_rust_core::engine::{EngineKind, EngineKinds};

pub fn kinds() -> EngineKinds {
    let kinds: Vec<Box<dyn EngineKind>> = vec![
        Box::new(triton_rust_engine_onnx::OnnxKind),
        Box::new(triton_rust_engine_torch::TorchKind),
        Box::new(triton_rust_engine_aoti::AotiKind),
        Box::new(triton_rust_engine_embedding::EmbeddingKind),
        Box::new(triton_rust_engine_recommender::RecommenderKind),
    ];
    EngineKinds::new(kinds)
}
