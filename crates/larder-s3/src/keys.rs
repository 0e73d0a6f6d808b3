//! Access key administration (`larder s3 key create/revoke/list`): the key ring is one record
//! in the cluster, changed by read-modify-writes at its partition primary, so two commands
//! never lose each other's keys. The command reaches storage like a frontend does (cluster map
//! and cluster secret or mutual TLS): only operators holding those can manage keys, and no
//! public endpoint can.

use std::collections::BTreeMap;
use std::sync::Arc;

use larder_router::Router;
use rand::distr::{Alphanumeric, SampleString};

use crate::error::S3Error;
use crate::records::{AccessKey, KeyRing, Permission, FORMAT, KEYS_DOC};
use crate::service::now_ms;
use crate::store::{Change, Records};

/// A key as created: the only time its secret is shown.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NewKey {
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// Changes the key ring.
pub struct KeyAdmin {
    records: Records,
}

impl KeyAdmin {
    /// The key ring through `records_router` (`S3Config::records_router`).
    pub fn new(records_router: Arc<Router>) -> KeyAdmin {
        KeyAdmin {
            records: Records::new(records_router.clone(), records_router),
        }
    }

    /// A new key with `grants` (bucket name or `*`, permission).
    pub async fn create(&self, grants: Vec<(String, Permission)>) -> Result<NewKey, S3Error> {
        let mut rng = rand::rng();
        let id = format!("LK{}", Alphanumeric.sample_string(&mut rng, 18)).to_uppercase();
        let secret = Alphanumeric.sample_string(&mut rng, 40);
        let key = AccessKey {
            secret: secret.clone(),
            created_ms: now_ms(),
            buckets: grants.into_iter().collect(),
        };
        self.records
            .update(KEYS_DOC, |ring: Option<KeyRing>| {
                let mut ring = ring.unwrap_or(KeyRing {
                    v: FORMAT,
                    keys: BTreeMap::new(),
                });
                ring.keys.insert(id.clone(), key.clone());
                Ok((Change::Put(ring), ()))
            })
            .await?;
        Ok(NewKey {
            access_key_id: id,
            secret_access_key: secret,
        })
    }

    /// Removes key `id`; false if there was none.
    pub async fn revoke(&self, id: &str) -> Result<bool, S3Error> {
        self.records
            .update(KEYS_DOC, |ring: Option<KeyRing>| {
                let Some(mut ring) = ring else {
                    return Ok((Change::Keep, false));
                };
                if ring.keys.remove(id).is_none() {
                    return Ok((Change::Keep, false));
                }
                Ok((Change::Put(ring), true))
            })
            .await
    }

    /// The secret of key `id` (for `larder s3 presign`), if the key exists.
    pub async fn secret(&self, id: &str) -> Result<Option<String>, S3Error> {
        let ring: KeyRing = self.records.read(KEYS_DOC).await?.unwrap_or_default();
        Ok(ring.keys.get(id).map(|k| k.secret.clone()))
    }

    /// Every key with its grants (secrets left out).
    pub async fn list(&self) -> Result<Vec<(String, BTreeMap<String, Permission>)>, S3Error> {
        let ring: KeyRing = self.records.read(KEYS_DOC).await?.unwrap_or_default();
        Ok(ring
            .keys
            .into_iter()
            .map(|(id, key)| (id, key.buckets))
            .collect())
    }
}
