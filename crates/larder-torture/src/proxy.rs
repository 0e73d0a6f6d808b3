//! A TCP proxy in front of each storage node: the cluster map names the proxy, the node listens
//! elsewhere (`listen` in its config), so every connection to the node, from frontends and from
//! its peers, passes here. Blocking a proxy cuts the node's open connections and refuses new ones:
//! the node is partitioned from everyone who dials it (its own pulls from peers still pass
//! through their proxies, so the partition is one-way: inbound).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    blocked: watch::Sender<bool>,
}

impl Proxy {
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let (blocked, watcher) = watch::channel(false);
        tokio::spawn(accept_loop(listener, target, watcher));
        Ok(Proxy { blocked })
    }

    pub fn set_blocked(&self, blocked: bool) {
        self.blocked.send_replace(blocked);
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, blocked: watch::Receiver<bool>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        if *blocked.borrow() {
            drop(inbound);
            continue;
        }
        tokio::spawn(relay(inbound, target, blocked.clone()));
    }
}

async fn relay(mut inbound: TcpStream, target: SocketAddr, mut blocked: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = blocked.wait_for(|b| *b) => {}
    }
}
