//! Storage nodes killed for real (SIGKILL) under a real frontend: quorum writes keep working with
//! one node down, fail clearly with two down, and every acknowledged blob is back after restart.

mod common;

use bytes::Bytes;
use common::h2::H2Client;
use common::Cluster;
use http::StatusCode;

fn blob(i: usize) -> Bytes {
    Bytes::from(
        (0..1000 + i * 37)
            .map(|j| (i * 31 + j * 7) as u8)
            .collect::<Vec<u8>>(),
    )
}

async fn put_many(client: &H2Client, range: std::ops::Range<usize>) -> Vec<(usize, String)> {
    let mut tasks = Vec::new();
    for i in range {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (status, id, json) = client.put(blob(i)).await;
            assert_eq!(status, StatusCode::CREATED, "{json}");
            (i, id.unwrap())
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

async fn assert_all_readable(client: &H2Client, blobs: &[(usize, String)]) {
    for (i, id) in blobs {
        let (status, body) = client.get(id).await;
        assert_eq!(status, StatusCode::OK, "blob {i} ({id})");
        assert_eq!(body, blob(*i), "blob {i} content");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_survives_one_dead_node_and_refuses_with_two() {
    let mut cluster = Cluster::start(3, 6);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let mut acknowledged = put_many(&client, 0..40).await;

    cluster.kill_node(0);
    acknowledged.extend(put_many(&client, 40..80).await);
    assert_all_readable(&client, &acknowledged).await;

    cluster.kill_node(1);
    let (status, id, json) = client.put(blob(999)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert!(id.is_none());
    assert_eq!(json["error"]["code"], "NotEnoughReplicas");
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("acknowledged"), "{message}");
    // With two of three replicas gone, reads either return the right bytes or fail; never wrong data.
    for (i, id) in &acknowledged {
        let (status, body) = client.get(id).await;
        if status == StatusCode::OK {
            assert_eq!(body, blob(*i));
        } else {
            assert!(
                status == StatusCode::SERVICE_UNAVAILABLE,
                "blob {i}: {status}"
            );
        }
    }

    cluster.restart_node(0);
    cluster.restart_node(1);
    // The restarted nodes recovered their logs without a clean shutdown.
    assert_all_readable(&client, &acknowledged).await;
    acknowledged.extend(put_many(&client, 80..100).await);
    assert_all_readable(&client, &acknowledged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_carries_hundreds_of_concurrent_streams() {
    let cluster = Cluster::start(3, 8);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let blobs = put_many(&client, 0..300).await;
    let mut tasks = Vec::new();
    for (i, id) in blobs {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (status, body) = client.get(&id).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(body, blob(i));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_shutdown_and_restart_keeps_everything() {
    let mut cluster = Cluster::start(3, 4);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let blobs = put_many(&client, 0..30).await;
    for i in 0..3 {
        cluster.stop_node(i);
    }
    for i in 0..3 {
        cluster.restart_node(i);
    }
    assert_all_readable(&client, &blobs).await;
}

/// Damage one replica's stored bytes under a running storage node: that node answers 500 for the
/// blob (its checksum fails), and reads through the frontend still return the exact bytes from
/// another replica. Never the damaged ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_replica_is_never_served_and_reads_fail_over() {
    let cluster = Cluster::start(3, 2);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data: Bytes = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into();
    let (id, node, path) = stored_everywhere(&cluster, &client, &data).await;
    common::damage(&cluster, 0, &path, &data[100_000..100_064]);

    let (status, _) = node.request(http::Method::GET, &path, Bytes::new()).await;
    assert_eq!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "the damaged replica refuses to serve"
    );
    for _ in 0..30 {
        let (status, body) = client.get(&id).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, data, "served bytes must be the stored ones");
    }
}

/// Damage past the first piece of a read is found after the replica answered 200 (reads are
/// streamed in pieces, `larder-storage/src/streamed.rs`): that replica resets the stream
/// rather than send a byte that fails its checksum, and the frontend reads the rest from
/// another replica, so its client gets exactly the stored bytes, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_past_the_first_piece_resets_the_stream_and_the_read_goes_on_elsewhere() {
    // Without hedges, each read asks one replica at a time (in random order): the damaged one
    // first now and then, and nothing else takes its place before it breaks off.
    let cluster = Cluster::start_full(
        3,
        2,
        "[router]\nhedging = false\n",
        "[store]\nread_piece_size = \"64KiB\"\n",
    );
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(4_000_000);
    let (id, node, path) = stored_everywhere(&cluster, &client, &data).await;
    // One byte in the sixtieth of the 62 pieces of 64 KiB (late enough that the answer's
    // head has gone out when the replica finds it).
    common::damage(&cluster, 0, &path, &data[3_900_000..3_900_064]);

    // The first piece is sound, so the replica answers 200 and breaks off where the damage
    // is (or resets the stream before its answer went out, when it finds the damage that
    // soon): never does the whole body arrive.
    match node.request_to_end(http::Method::GET, &path).await {
        Ok((StatusCode::OK, Err(_))) | Err(_) => {}
        Ok((status, body)) => panic!("the damaged replica answered {status}: {body:?}"),
    }
    // A range that ends before the damage is served whole.
    let mut ranged = http::Request::get(format!("http://{}{path}", cluster.node_addr(0)));
    ranged = ranged.header(http::header::RANGE, "bytes=0-500000");
    let (status, _, bytes) = node.send(ranged.body(Default::default()).unwrap()).await;
    assert_eq!(status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(bytes, data.slice(0..500_001));

    for _ in 0..30 {
        let (status, body) = client.get(&id).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, data, "served bytes must be the stored ones");
    }
    let metrics = common::metrics::scrape_frontend(cluster.frontend_addr).unwrap();
    let resumed = common::metrics::value(&metrics, "larder_frontend_reads_resumed_total");
    assert!(
        resumed.is_some_and(|n| n >= 1.0),
        "no read went on elsewhere: {resumed:?}"
    );
}

/// A storage node SIGKILLed while it sends a download: the frontend reads the rest from
/// another replica and its client gets every byte, in one unbroken body. Small pool windows and
/// pieces keep the node's stream open while the client reads slowly; the node serving it is
/// the one whose large-read counter moved. The blob is 12 MB, stored whole: the frontend's
/// socket to the client takes up to 4 MiB of it (Linux's send-buffer autotuning on loopback),
/// so with 4 MB the node had sometimes sent the whole blob before it was killed (2 runs in 12
/// ended with no resume).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_goes_on_from_another_replica_when_its_node_dies_mid_way() {
    use tokio::io::AsyncReadExt;
    let frontend = "[router]\nhedging = false\n\n[pool]\nstream_window = \"64KiB\"\n\n\
                    [chunking]\nchunk_size = \"12MiB\"\n";
    let storage = "[store]\nread_piece_size = \"64KiB\"\n";
    let mut cluster = Cluster::start_full(3, 2, frontend, storage);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(12_000_000);
    let (id, _, _) = stored_everywhere(&cluster, &client, &data).await;
    let before = large_reads(&cluster).await;

    let mut download = slow_download(cluster.frontend_addr, &id).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while got.len() < 300_000 {
        let n = download.read(&mut buf).await.unwrap();
        assert!(n > 0, "the download ended after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let after = large_reads(&cluster).await;
    let serving = (0..3)
        .find(|&i| after[i] > before[i])
        .expect("a node serving the read");
    cluster.kill_node(serving);
    download.read_to_end(&mut got).await.unwrap();
    assert_whole(&got, &data);
    let metrics = common::metrics::scrape_frontend(cluster.frontend_addr).unwrap();
    let resumed = common::metrics::value(&metrics, "larder_frontend_reads_resumed_total");
    assert_eq!(resumed, Some(1.0), "the read went on once");
}

/// Thirty clients that ask for a 4 MB blob and read nothing do not stop other downloads: the
/// frontend lets go of their replicas' streams once they stall (`park.rs`), which gives the
/// pool connection's window back (one connection per node with a 1 MiB window here, which 30
/// stalled downloads fill, so without parking the download behind them never ends), and
/// when they read at last, each gets every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_are_parked_and_other_downloads_go_on() {
    let frontend = "[pool]\nconnections_per_node = 1\nconnection_window = \"1MiB\"\n\
                    stream_window = \"1MiB\"\n\n[router]\nhedging = false\n\
                    park_stalled_reads_after = \"300ms\"\n";
    let cluster = Cluster::start_with(3, 2, frontend);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(4_000_000);
    let (id, stalled) = stalled_downloads(&cluster, &client, &data, 30).await;
    let (status, body) = tokio::time::timeout(std::time::Duration::from_secs(15), client.get(&id))
        .await
        .expect("a download behind stalled ones never ended");
    assert_eq!(status, StatusCode::OK);
    assert!(body == data, "the stored bytes");
    read_whole(stalled, &data).await;
    assert!(parked(&cluster) >= 1.0, "none parked");
}

/// `park_stalled_reads_after = 0` turns parking off: downloads whose clients stop reading keep
/// their replicas' streams (none is parked), and each still gets every byte when it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_parking_off_stalled_downloads_keep_their_streams() {
    let frontend = "[router]\nhedging = false\npark_stalled_reads_after = \"0s\"\n";
    let cluster = Cluster::start_with(3, 2, frontend);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(4_000_000);
    let (_, stalled) = stalled_downloads(&cluster, &client, &data, 3).await;
    read_whole(stalled, &data).await;
    assert_eq!(parked(&cluster), 0.0, "parked with parking off");
}

/// Storage nodes whose read budget (three 256 KiB pieces) stalled downloads have spent answer a
/// new read 503 `ReadBudgetSpent`; the frontend then parks its downloads that have gone unasked
/// for a second at once (its period here is a minute), which gives the budget back, and the
/// new read is served. The stalled clients get every byte when they read (or a 503, if their
/// own read found every budget spent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_read_budget_makes_the_frontend_park_its_stalled_downloads() {
    // 12 MB blobs stored whole (the sockets' buffers between frontend and client take a few
    // MB of each download), streams with a 1 MiB window (but not the connection: a stalled
    // download left unparked would hold it all, and the others with it).
    let frontend = "[pool]\nconnections_per_node = 1\nconnection_window = \"64MiB\"\n\
                    stream_window = \"1MiB\"\n\n[router]\nhedging = false\n\
                    park_stalled_reads_after = \"60s\"\n\n[chunking]\nchunk_size = \"12MiB\"\n";
    let storage = "[store]\nread_piece_size = \"256KiB\"\n\n\
                   [limits]\nread_budget = \"768KiB\"\nread_budget_wait = \"200ms\"\n";
    let cluster = Cluster::start_full(3, 2, frontend, storage);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(12_000_000);
    let (id, stalled) = stalled_downloads(&cluster, &client, &data, 12).await;
    let (status, body) = client.get(&id).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert!(body == data, "the stored bytes");
    let mut whole = 0;
    for download in stalled {
        whole += usize::from(whole_or_refused(download, &data).await);
    }
    assert!(whole >= 3, "only {whole} stalled downloads were served");
    // How: held-up reads made the frontend park stalled downloads (a minute before their
    // period), more than once as the clients read one after another.
    assert!(read_pressure(&cluster) >= 1.0, "no pressure");
    assert!(parked(&cluster) >= 1.0, "none parked");
}

/// A frontend's downloads hold at most its download budget (8 MiB here, eight 1 MiB frames):
/// twelve clients that read nothing of a 12 MB blob pin a frame each in hyper's buffers, or
/// are refused; a new download then waits a second and gets 503 `DownloadBudgetSpent`. When
/// the clients read, every one served gets every byte, every share comes back, and a new
/// download is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_hold_at_most_the_download_budget_and_give_it_back() {
    let (cluster, client, data, id, stalled) = budget_spent_by_stalled_clients("").await;
    let refusals = "larder_frontend_download_budget_refusals_total";
    let before = frontend_count(&cluster, refusals);
    let started = std::time::Instant::now();
    assert_refused_for_want_of_budget(&client, &id).await;
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    // At least this GET (a stalled download that came late may have been refused meanwhile).
    assert!(frontend_count(&cluster, refusals) >= before + 1.0);
    // Read together: each may need the shares the others give back.
    let reads = stalled.into_iter().map(|d| whole_or_refused(d, &data));
    let served = futures_util::future::join_all(reads).await;
    let served = served.into_iter().filter(|&whole| whole).count();
    assert!(served >= 8, "only {served} stalled downloads were served");
    assert_served_and_budget_given_back(&cluster, &client, &id, &data).await;
}

/// When reads are held up, a connection that has taken nothing for `stalled_send_timeout`
/// (2 s here) is dropped: twelve clients that read nothing spend an 8 MiB download budget, and
/// a new download, whose wait for a share raises the pressure, is served once their
/// connections are gone. They get less than the whole blob, or a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_nothing_while_reads_are_held_up_lose_their_connections() {
    let limits = "[limits]\nstalled_send_timeout = \"2s\"\n";
    let (cluster, client, data, id, stalled) = budget_spent_by_stalled_clients(limits).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (status, body) = client.get(&id).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body == data, "the stored bytes");
    let dropped = frontend_count(
        &cluster,
        "larder_frontend_client_connections_timed_out_total{timeout=\"stalled_send\"}",
    );
    assert!(dropped >= 1.0, "no connection dropped");
    let mut cut = 0;
    for download in stalled {
        cut += usize::from(is_cut_short(download, &data).await);
    }
    assert!(cut as f64 >= dropped, "{dropped} dropped, {cut} cut short");
    assert_eq!(
        download_budget_held(&cluster),
        0.0,
        "a share was not given back"
    );
}

/// A composite blob's download takes each chunk's share before fetching it (4 MiB chunks, an
/// 8 MiB budget): one client that reads nothing holds the chunk hyper is sending and the one
/// read ahead, which spends the budget, and another download is refused; once the client
/// reads, it gets every byte and the shares come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_downloads_take_their_chunks_from_the_download_budget() {
    let frontend = "[router]\nhedging = false\n\
                    download_budget = \"8MiB\"\ndownload_budget_wait = \"500ms\"\n";
    let cluster = Cluster::start_with(3, 2, frontend);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(20_000_000);
    let (id, stalled) = stalled_downloads(&cluster, &client, &data, 1).await;
    assert_most_of_8_mib_held(&cluster);
    assert_refused_for_want_of_budget(&client, &id).await;
    read_whole(stalled, &data).await;
    assert_served_and_budget_given_back(&cluster, &client, &id, &data).await;
}

/// Reads `download` to its end: whether it was a 200 cut short (its connection dropped). A 503
/// or a whole body is not; whatever it got must be the blob's first bytes.
async fn is_cut_short(mut download: tokio::net::TcpStream, data: &[u8]) -> bool {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let _ = download.read_to_end(&mut got).await;
    if got.starts_with(b"HTTP/1.1 503") {
        return false;
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        &got[..got.len().min(40)]
    );
    let start = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let body = &got[start..];
    assert!(
        body.len() <= data.len() && body == &data[..body.len()],
        "not the blob's bytes"
    );
    body.len() < data.len()
}

/// Reads `download` to its end: true for a 200 with exactly `data`, false for a 503.
async fn whole_or_refused(mut download: tokio::net::TcpStream, data: &[u8]) -> bool {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    download.read_to_end(&mut got).await.unwrap();
    if got.starts_with(b"HTTP/1.1 503") {
        return false;
    }
    assert_whole(&got, data);
    true
}

/// The bytes the frontend's downloads hold now.
fn download_budget_held(cluster: &Cluster) -> f64 {
    frontend_count(cluster, "larder_frontend_download_budget_held_bytes")
}

/// Stalled downloads hold nearly all of an 8 MiB download budget, and no more.
fn assert_most_of_8_mib_held(cluster: &Cluster) {
    let held = download_budget_held(cluster);
    assert!(
        (7 << 20) as f64 <= held && held <= (8 << 20) as f64,
        "stalled downloads hold {held} bytes of an 8 MiB budget"
    );
}

/// A GET of blob `id` is answered 503 `DownloadBudgetSpent`.
async fn assert_refused_for_want_of_budget(client: &H2Client, id: &str) {
    let (status, body) = client.get(id).await;
    let answer = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(answer.contains("DownloadBudgetSpent"), "{answer}");
}

/// A GET of blob `id` gets `data`, after which the downloads hold nothing.
async fn assert_served_and_budget_given_back(
    cluster: &Cluster,
    client: &H2Client,
    id: &str,
    data: &Bytes,
) {
    let (status, body) = client.get(id).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body == data, "the stored bytes");
    assert_eq!(
        download_budget_held(cluster),
        0.0,
        "a share was not given back"
    );
}

/// A cluster whose frontend (an 8 MiB download budget, no hedging, stalled reads never parked,
/// 12 MB blobs stored whole; and `extra`) has its budget spent by twelve downloads of a 12 MB
/// blob that read nothing: the cluster, a client, the blob, its ID and the downloads.
async fn budget_spent_by_stalled_clients(
    extra: &str,
) -> (Cluster, H2Client, Bytes, String, Vec<tokio::net::TcpStream>) {
    let frontend = format!(
        "[router]\nhedging = false\npark_stalled_reads_after = \"0s\"\n\
         download_budget = \"8MiB\"\ndownload_budget_wait = \"1s\"\n\n\
         [chunking]\nchunk_size = \"12MiB\"\n\n{extra}"
    );
    let cluster = Cluster::start_with(3, 2, &frontend);
    let client = H2Client::connect(cluster.frontend_addr).await;
    let data = random_bytes(12_000_000);
    let (id, stalled) = stalled_downloads(&cluster, &client, &data, 12).await;
    assert_most_of_8_mib_held(&cluster);
    (cluster, client, data, id, stalled)
}

/// Stores `data` and opens `n` downloads of it that then read nothing for a second: the blob's
/// ID and the downloads.
async fn stalled_downloads(
    cluster: &Cluster,
    client: &H2Client,
    data: &Bytes,
    n: usize,
) -> (String, Vec<tokio::net::TcpStream>) {
    let (status, id, _) = client.put(data.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let id = id.unwrap();
    let mut stalled = Vec::new();
    for _ in 0..n {
        stalled.push(slow_download(cluster.frontend_addr, &id).await);
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    (id, stalled)
}

/// Reads each download to its end: each is a 200 with exactly `data`.
async fn read_whole(downloads: Vec<tokio::net::TcpStream>, data: &[u8]) {
    use tokio::io::AsyncReadExt;
    for mut download in downloads {
        let mut got = Vec::new();
        download.read_to_end(&mut got).await.unwrap();
        assert_whole(&got, data);
    }
}

/// The frontend's count of parked downloads (0 before any).
fn parked(cluster: &Cluster) -> f64 {
    frontend_count(cluster, "larder_frontend_reads_parked_total")
}

/// The frontend's count of held-up reads that made it park stalled downloads sooner.
fn read_pressure(cluster: &Cluster) -> f64 {
    frontend_count(cluster, "larder_frontend_read_pressure_total")
}

fn frontend_count(cluster: &Cluster, series: &str) -> f64 {
    let metrics = common::metrics::scrape_frontend(cluster.frontend_addr).unwrap();
    common::metrics::value(&metrics, series).unwrap_or(0.0)
}

/// An HTTP/1.1 GET of blob `id` (the connection closes after it) from a client with a 4 KiB
/// receive buffer, so that the frontend cannot push the whole blob into the sockets.
async fn slow_download(frontend: std::net::SocketAddr, id: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut download = socket.connect(frontend).await.unwrap();
    let request =
        format!("GET /v1/blobs/{id} HTTP/1.1\r\nHost: larder\r\nConnection: close\r\n\r\n");
    download.write_all(request.as_bytes()).await.unwrap();
    download
}

/// `answer` is a 200 whose body is exactly `data`.
fn assert_whole(answer: &[u8], data: &[u8]) {
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", &answer[..40]);
    let start = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(answer.len() - start, data.len(), "every byte, once");
    assert!(answer[start..] == data[..], "the stored bytes");
}

/// Bytes that never repeat a 64-byte run, so damage lands where it is meant to.
fn random_bytes(len: usize) -> Bytes {
    let mut x = 1u64;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 56) as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Each storage node's count of bytes of large records read (its metrics).
async fn large_reads(cluster: &Cluster) -> Vec<f64> {
    node_metric_sums(cluster, "larder_storage_large_read_bytes_total{").await
}

/// Each storage node's sum of the series whose lines start with `prefix`.
async fn node_metric_sums(cluster: &Cluster, prefix: &str) -> Vec<f64> {
    let mut sums = Vec::new();
    for i in 0..3 {
        let node = cluster.node_client(cluster.node_addr(i)).await;
        let (_, body) = node
            .request(http::Method::GET, "/internal/v1/metrics", Bytes::new())
            .await;
        let text = String::from_utf8_lossy(&body);
        let sum: f64 = text
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        sums.push(sum);
    }
    sums
}

/// PUTs `data` through `client` and waits until node 0 holds it too (the PUT was answered at
/// a quorum of two): its ID, a client of node 0, and the blob's path on storage nodes.
async fn stored_everywhere(
    cluster: &Cluster,
    client: &H2Client,
    data: &Bytes,
) -> (String, H2Client, String) {
    let (status, id, _) = client.put(data.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    let id = id.unwrap();
    let parsed: larder_cluster::BlobId = id.parse().unwrap();
    let node = cluster.node_client(cluster.node_addr(0)).await;
    let path = larder_proto::blob_path(parsed.partition, &id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while node.request(http::Method::GET, &path, Bytes::new()).await.0 != StatusCode::OK {
        assert!(
            std::time::Instant::now() < deadline,
            "the third replica never stored the blob"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    (id, node, path)
}

/// A blob whose datacenter of origin cannot answer is unavailable (503), not "not found" (404),
/// however many replicas elsewhere lack it: they may not have pulled it yet. (The nemesis suite
/// saw a 404 for a blob acknowledged 2 s before, counted from the other datacenter's replicas.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_elsewhere_lacking_a_blob_do_not_make_it_not_found() {
    // Nodes are dealt round-robin: 0, 2, 4 in dc1 and 1, 3, 5 in dc2.
    let mut cluster = Cluster::start_in(&["dc1", "dc2"], 6, 4, "");
    for i in [1, 3, 5] {
        cluster.kill_node(i);
    }
    let client = H2Client::connect(cluster.frontend_addrs[0]).await;
    let (status, id, json) = client.put(blob(1)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let id = id.unwrap();
    // dc2 comes back without the blob (its only source, dc1, is gone before it can pull).
    for i in [0, 2, 4] {
        cluster.kill_node(i);
    }
    for i in [1, 3, 5] {
        cluster.restart_node(i);
    }
    let (status, body) = client.get(&id).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&body)
    );
}
