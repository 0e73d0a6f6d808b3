//! Concurrent changes of one bucket's names through one frontend, written in batches
//! (`larder-s3/src/index_batch.rs`): every PUT of its own name lands, `If-None-Match: *` on one
//! name lets exactly one of the racers in, and deletes and puts at once leave exactly what they
//! say. curl with presigned URLs, many at a time.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::Cluster;

const BUCKET: &str = "busy";

struct Signer {
    urls: common::Presigner,
    dir: PathBuf,
}

impl Signer {
    fn url(&self, method: &str, object: &str, query: &[(&str, &str)]) -> String {
        self.urls.url(method, BUCKET, object, query)
    }

    fn put(&self, name: &str, extra: &[&str]) -> u16 {
        let url = self.url("PUT", name, &[]);
        let args = [&["-X", "PUT", "--data-binary", name][..], extra, &[&url]].concat();
        common::curl(&self.dir, &args).status
    }

    fn delete(&self, name: &str) -> u16 {
        let url = self.url("DELETE", name, &[]);
        common::curl(&self.dir, &["-X", "DELETE", &url]).status
    }

    fn list(&self) -> BTreeSet<String> {
        let answer = common::curl(&self.dir, &[&self.url("GET", "", &[("list-type", "2")])]);
        assert_eq!(answer.status, 200);
        let text = String::from_utf8(answer.body).unwrap();
        text.split("<Key>")
            .skip(1)
            .map(|rest| rest.split("</Key>").next().unwrap().to_owned())
            .collect()
    }
}

/// `n` threads, each running `f(i)`; their results in order.
fn at_once<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || f(i))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn signer(cluster: &Cluster, dir: &Path, s3: SocketAddr) -> Signer {
    Signer {
        urls: common::Presigner::new(cluster, s3, &["*:owner"]),
        dir: dir.to_path_buf(),
    }
}

#[test]
fn concurrent_puts_and_deletes_of_one_bucket_each_land_once() {
    let s3 = common::free_addresses(1)[0];
    let extra = format!("[s3]\nlisten = \"{s3}\"\n");
    let cluster = Cluster::start_with(3, 4, &extra);
    common::wait_for_port(s3);
    let signer = Arc::new(signer(&cluster, cluster.dir.path(), s3));
    let create = signer.url("PUT", "", &[]);
    assert_eq!(
        common::curl(&signer.dir, &["-X", "PUT", &create]).status,
        200
    );

    let s = signer.clone();
    let statuses = at_once(24, move |i| s.put(&format!("n{i:02}"), &[]));
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let all: BTreeSet<String> = (0..24).map(|i| format!("n{i:02}")).collect();
    assert_eq!(signer.list(), all);

    // One name, many racers with If-None-Match: *: exactly one is let in.
    let s = signer.clone();
    let statuses = at_once(12, move |_| s.put("contested", &["-H", "If-None-Match: *"]));
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 412).count();
    assert_eq!((admitted, refused), (1, 11), "{statuses:?}");

    // Deletes of the even names and puts of new ones, all at once.
    let s = signer.clone();
    let statuses = at_once(24, move |i| match i % 2 {
        0 => s.delete(&format!("n{i:02}")),
        _ => s.put(&format!("m{i:02}"), &[]),
    });
    assert!(
        statuses.iter().all(|s| *s == 204 || *s == 200),
        "{statuses:?}"
    );
    let mut expected: BTreeSet<String> = (1..24).step_by(2).map(|i| format!("n{i:02}")).collect();
    expected.extend((1..24).step_by(2).map(|i| format!("m{i:02}")));
    expected.insert("contested".into());
    assert_eq!(signer.list(), expected);
}
