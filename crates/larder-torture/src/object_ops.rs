//! The workload's named-object operations: PutObject (35%), GetObject (35%), DeleteObject (15%)
//! of one of the worker's keys, and ListObjectsV2 of the worker's prefix (15%).

use bytes::Bytes;
use http::Method;

use crate::client::Connection;
use crate::content::{self, Rng};
use crate::history::{Op, Outcome};
use crate::objects::{self, KEYS_PER_WORKER, MAX_OBJECT};
use crate::workload::{Target, Workload};

impl Workload {
    pub(crate) async fn object_op(
        &self,
        conn: &mut Connection,
        worker: usize,
        bucket: &str,
        target: &Target,
        rng: &mut Rng,
    ) {
        let key = objects::object_key(worker, rng.range(0, KEYS_PER_WORKER));
        let name = format!("w{worker}");
        let dc = target.datacenter.as_str();
        let (what, method, object, query, body) = match rng.range(0, 100) {
            0..=34 => {
                let seed = rng.next_u64();
                let len = content::blob_size(rng, MAX_OBJECT);
                let data = content::bytes(seed, len);
                let sha256 = content::sha256_hex(&data);
                let what = Op::ObjPut { seed, len, sha256 };
                (what, Method::PUT, key, None, Bytes::from(data))
            }
            35..=69 => (Op::ObjGet, Method::GET, key, None, Bytes::new()),
            70..=84 => (Op::ObjDelete, Method::DELETE, key, None, Bytes::new()),
            _ => {
                let prefix = format!("w{worker}/");
                (
                    Op::ObjList,
                    Method::GET,
                    String::new(),
                    Some(prefix),
                    Bytes::new(),
                )
            }
        };
        let id = format!("{bucket}/{}", query.as_deref().unwrap_or(&object));
        let started = self.history.invoke(&name, dc, &what, Some(&id));
        let list_query;
        let query: &[(&str, &str)] = match &query {
            Some(prefix) => {
                list_query = [("list-type", "2"), ("prefix", prefix.as_str())];
                &list_query
            }
            None => &[],
        };
        let result = objects::send(
            conn,
            target.s3,
            &self.s3_key,
            method,
            (bucket, &object),
            query,
            body,
        )
        .await;
        let status = result.as_ref().ok().map(|a| a.status.as_u16());
        let outcome = match (&what, status) {
            (Op::ObjPut { .. }, Some(200)) | (Op::ObjDelete, Some(204)) => Outcome::Ok,
            (Op::ObjGet | Op::ObjList, Some(200)) => Outcome::Ok,
            // NoSuchKey: the read saw no object.
            (Op::ObjGet, Some(404)) => Outcome::Fail,
            // A definite refusal before anything was stored (400, 403, 411…); 408 and 429 are
            // S3's "try again" and 5xx may have linked the name, as may a lost answer.
            (Op::ObjPut { .. } | Op::ObjDelete, Some(s)) if is_refusal(s) => Outcome::Fail,
            _ => Outcome::Unknown,
        };
        let mut completion = self.record(started, (&name, dc), Some(id), what, &result, outcome);
        match &result {
            Ok(answer) if !answer.status.is_success() => {
                // S3's error code and message, for whoever reads the history.
                let excerpt = &answer.body[..answer.body.len().min(300)];
                completion.detail = Some(String::from_utf8_lossy(excerpt).into_owned());
            }
            _ => {}
        }
        if let (Outcome::Ok, Ok(answer)) = (outcome, &result) {
            match completion.what {
                Op::ObjGet => completion.read_sha256 = Some(content::sha256_hex(&answer.body)),
                Op::ObjList => match objects::listed_keys(&answer.body) {
                    Some(keys) => {
                        let ids = keys.iter().map(|k| format!("{bucket}/{k}")).collect();
                        completion.listed = Some(ids);
                    }
                    None => completion.outcome = Outcome::Unknown,
                },
                _ => {}
            }
        }
        self.history.complete(completion);
    }
}

fn is_refusal(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}
