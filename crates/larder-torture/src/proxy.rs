//! A TCP proxy in front of each storage node: the cluster map names the proxy, the node listens
//! elsewhere (`listen` in its config), so every connection to the node, from frontends and from
//! its peers, passes here. A partition is two-way: the partitioned node's proxy cuts its open
//! connections and refuses new ones (nobody reaches it), and every proxy cuts and refuses the
//! connections the partitioned node itself opened (it reaches nobody: its pulls from peers, its
//! writes to them). Which process opened a connection is read from `/proc` (its sockets' inodes
//! among the process's open files, their addresses in `/proc/net/tcp`), and only while a process
//! is isolated: that table lists every socket of the machine, too long to read per connection.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Processes cut off from every node (the far side of a two-way partition).
#[derive(Clone)]
pub struct Isolated {
    pids: Arc<Mutex<HashSet<i32>>>,
    /// The local addresses of the isolated processes' TCP sockets when the set last changed:
    /// their open connections, which the relays carrying them cut.
    sources: Arc<watch::Sender<HashSet<SocketAddr>>>,
}

impl Default for Isolated {
    fn default() -> Self {
        Isolated {
            pids: Arc::default(),
            sources: Arc::new(watch::channel(HashSet::new()).0),
        }
    }
}

impl Isolated {
    pub fn set(&self, pid: i32, isolated: bool) {
        let pids = {
            let mut pids = self.pids.lock().unwrap_or_else(|e| e.into_inner());
            match isolated {
                true => pids.insert(pid),
                false => pids.remove(&pid),
            };
            pids.clone()
        };
        self.sources.send_replace(socket_addresses_of(&pids));
    }

    pub fn clear(&self) {
        self.pids.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.sources.send_replace(HashSet::new());
    }

    /// Whether the connection from `from` to `to`, just accepted, was opened by an isolated
    /// process (one it opened after the set changed is not among `sources`).
    fn opened(&self, from: SocketAddr, to: SocketAddr) -> bool {
        let pids = self.pids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if pids.is_empty() {
            return false;
        }
        self.sources.borrow().contains(&from)
            || socket_inode(from, to).is_some_and(|inode| socket_inodes_of(&pids).contains(&inode))
    }
}

pub struct Proxy {
    blocked: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(
        listen: SocketAddr,
        target: SocketAddr,
        isolated: &Isolated,
    ) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let (blocked, watcher) = watch::channel(false);
        tokio::spawn(accept_loop(listener, target, watcher, isolated.clone()));
        Ok(Proxy { blocked })
    }

    pub fn set_blocked(&self, blocked: bool) {
        self.blocked.send_replace(blocked);
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    blocked: watch::Receiver<bool>,
    isolated: Isolated,
) {
    let Ok(listen) = listener.local_addr() else {
        return;
    };
    loop {
        let Ok((inbound, from)) = listener.accept().await else {
            continue;
        };
        if *blocked.borrow() || isolated.opened(from, listen) {
            drop(inbound);
            continue;
        }
        tokio::spawn(relay(
            inbound,
            from,
            target,
            blocked.clone(),
            isolated.sources.subscribe(),
        ));
    }
}

async fn relay(
    mut inbound: TcpStream,
    from: SocketAddr,
    target: SocketAddr,
    mut blocked: watch::Receiver<bool>,
    mut isolated: watch::Receiver<HashSet<SocketAddr>>,
) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = blocked.wait_for(|b| *b) => {}
        _ = isolated.wait_for(|sources| sources.contains(&from)) => {}
    }
}

/// The local addresses of the TCP (IPv4) sockets `pids` hold open.
fn socket_addresses_of(pids: &HashSet<i32>) -> HashSet<SocketAddr> {
    if pids.is_empty() {
        return HashSet::new();
    }
    let inodes = socket_inodes_of(pids);
    tcp_table()
        .filter(|(_, _, inode)| inodes.contains(inode))
        .map(|(local, _, _)| local)
        .collect()
}

/// The inode of the socket connected from `from` to `to`, from `/proc/net/tcp`.
fn socket_inode(from: SocketAddr, to: SocketAddr) -> Option<u64> {
    tcp_table().find_map(|(local, remote, inode)| (local == from && remote == to).then_some(inode))
}

/// `/proc/net/tcp`'s IPv4 sockets: local address, remote address, inode.
fn tcp_table() -> impl Iterator<Item = (SocketAddr, SocketAddr, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let rows: Vec<_> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = parse_proc_addr(fields.get(1)?)?;
            let remote = parse_proc_addr(fields.get(2)?)?;
            Some((local, remote, fields.get(9)?.parse().ok()?))
        })
        .collect();
    rows.into_iter()
}

/// An address as `/proc/net/tcp` writes it: the IPv4 address as a little-endian hex word, a
/// colon, the port in hex.
fn parse_proc_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let ip = u32::from_str_radix(ip, 16).ok()?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = Ipv4Addr::from(ip.to_le_bytes());
    Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
}

/// The inodes of the sockets `pids` hold open.
fn socket_inodes_of(pids: &HashSet<i32>) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|n| n.parse().ok())
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_as_proc_net_tcp_writes_them() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(parse_proc_addr("0100007F:1F90"), Some(addr));
        assert_eq!(parse_proc_addr("0100007F"), None);
        assert_eq!(parse_proc_addr("zz:1F90"), None);
    }

    #[tokio::test]
    async fn a_connection_is_traced_to_the_process_that_opened_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(to).unwrap();
        let (_server, from) = listener.accept().unwrap();
        let inode = socket_inode(from, to).expect("the connecting socket is listed");
        let me = HashSet::from([std::process::id() as i32]);
        assert!(socket_inodes_of(&me).contains(&inode));
        assert!(socket_addresses_of(&me).contains(&from));
        assert!(!socket_inodes_of(&HashSet::from([1])).contains(&inode));
        drop(client);
    }

    /// A child process that connects to `proxy`, sends a byte and prints what comes back
    /// ("closed" when the connection is cut), once at start and once per line on its stdin.
    fn echo_client(proxy: SocketAddr) -> std::process::Child {
        let script = format!(
            "import socket,sys\n\
             s=socket.create_connection(('127.0.0.1',{}))\n\
             def ask():\n\
             \x20 try:\n\
             \x20  s.sendall(b'x'); d=s.recv(1)\n\
             \x20 except OSError: d=b''\n\
             \x20 print(d.decode() or 'closed', flush=True)\n\
             ask()\n\
             for _ in sys.stdin: ask()\n",
            proxy.port()
        );
        std::process::Command::new("python3")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn answer(child: &mut std::process::Child) -> String {
        use std::io::BufRead;
        let stdout = child.stdout.as_mut().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line.trim().to_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_isolated_process_is_refused_and_its_open_connections_cut() {
        use std::io::Write;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut byte = [0u8; 1];
                    while conn.read_exact(&mut byte).await.is_ok() {
                        let _ = conn.write_all(&byte).await;
                    }
                });
            }
        });
        let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_addr = listen.local_addr().unwrap();
        drop(listen);
        let isolated = Isolated::default();
        let _proxy = Proxy::start(proxy_addr, target, &isolated).await.unwrap();

        // Open before the isolation: it works, then it is cut.
        let mut client = echo_client(proxy_addr);
        assert_eq!(answer(&mut client), "x");
        isolated.set(client.id() as i32, true);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        writeln!(client.stdin.as_mut().unwrap()).unwrap();
        assert_eq!(answer(&mut client), "closed");
        client.kill().unwrap();
        client.wait().unwrap();

        // Opened while others are isolated: it passes.
        let mut other = echo_client(proxy_addr);
        assert_eq!(answer(&mut other), "x");
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
