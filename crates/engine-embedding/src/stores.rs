//! The stores shared by name among a backend's models (`store_name`): how an update model
//! reaches the tables a lookup model serves.

use std::sync::{Arc, Mutex, Weak};

use triton_rust_core::error::{Error, Result};
use triton_rust_embedding::EmbeddingStore;

use crate::settings::StoreSettings;

/// The stores shared by name among the models of one backend (kept in the backend's
/// [`Shared`]: a store lives while a model uses it, the registry while the backend does).
#[derive(Default)]
pub struct Stores(Mutex<Vec<(String, Weak<EmbeddingStore>)>>);

/// The store `settings` name: the one already open under that name, else opened now.
pub(crate) fn shared_store(
    stores: &Stores,
    settings: &StoreSettings,
) -> Result<Arc<EmbeddingStore>> {
    let mut stores = stores.0.lock().map_err(|_| Error::internal("store registry poisoned"))?;
    stores.retain(|(_, w)| w.strong_count() > 0);
    if let Some(store) =
        stores.iter().find(|(n, _)| *n == settings.name).and_then(|(_, w)| w.upgrade())
    {
        let same = store.table_count() == settings.store.tables.len()
            && store
                .tables()
                .zip(&settings.store.tables)
                .all(|(a, b)| a.name == b.name && a.dim == b.dim);
        if !same {
            return Err(Error::invalid_arg(format!(
                "store '{}' is already loaded with other tables; models sharing a store_name must list the same tables and dims",
                settings.name
            )));
        }
        // the store's GPU caches are made once for all its models: they must agree on their rows
        if store.cache_rows() != settings.store.cache_rows {
            return Err(Error::invalid_arg(format!(
                "store '{}' is already loaded with gpucache_row_type {}; models sharing a store_name must ask the same",
                settings.name,
                store.cache_rows().name()
            )));
        }
        if store.cache_eviction() != settings.store.cache_eviction {
            return Err(Error::invalid_arg(format!(
                "store '{}' is already loaded with gpucache_policy {}; models sharing a store_name must ask the same",
                settings.name,
                store.cache_eviction().name()
            )));
        }
        if store.hit_stamp_every() != settings.store.hit_stamp_every {
            return Err(Error::invalid_arg(format!(
                "store '{}' is already loaded with gpucache_hit_stamp_every {}; models sharing a store_name must ask the same",
                settings.name,
                store.hit_stamp_every()
            )));
        }
        if store.cache_index() != settings.store.cache_index {
            return Err(Error::invalid_arg(format!(
                "store '{}' is already loaded with gpucache_key_index {}; models sharing a store_name must ask the same",
                settings.name,
                store.cache_index().name()
            )));
        }
        return Ok(store);
    }
    let remote = match &settings.volatile_db {
        None => None,
        Some(spec) => {
            Some(triton_rust_embedding::redis::RedisTier::from_spec(spec, &settings.redis_access)?)
        }
    };
    let store = EmbeddingStore::open(settings.store.clone(), remote)?;
    for (i, t) in store.tables().enumerate() {
        let memory = store.host_memory(i);
        log::info!(
            "store '{}': table '{}' dim {} with {} rows on the host ({:.2}× the raw bytes{}), cache {} rows",
            settings.name,
            t.name,
            t.dim,
            store.host_rows(i),
            memory.ratio(),
            if memory.copied { ", copied into 2 MiB pages" } else { "" },
            store.cache_geometry(i).capacity()
        );
    }
    stores.push((settings.name.clone(), Arc::downgrade(&store)));
    Ok(store)
}
