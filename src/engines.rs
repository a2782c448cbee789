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
        Box::new(triton_rust_engine_recommender::SequenceKind),
    ];
    EngineKinds::new(kinds)
}

#[cfg(test)]
mod tests {
    use triton_rust_core::settings::{section_rows, BackendSettings};

    #[test]
    fn the_backend_settings_documented_are_those_the_core_and_the_engines_read() {
        let md = include_str!("../docs/settings.md");
        let kinds = super::kinds();
        let mut code: Vec<(String, String)> = BackendSettings::KNOWN
            .iter()
            .chain(kinds.claims().iter().flat_map(|c| c.backend_keys.iter()))
            .map(|(k, d)| (k.to_string(), d.to_string()))
            .collect();
        code.sort();
        code.dedup();
        let mut doc = section_rows(md, "Backend settings");
        doc.sort();
        assert_eq!(doc, code);
        for var in kinds.environment() {
            assert!(md.contains(&format!("`{var}`")), "docs/settings.md does not name {var}");
        }
    }
}
