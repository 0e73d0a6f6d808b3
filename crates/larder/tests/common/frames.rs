//! A frame-level HTTP/2 client for abuse tests: it writes whatever frames it is told to,
//! including ones no polite client would, and a reader thread records what the server answers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const CONTINUATION: u8 = 9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame received: type, flags, stream and payload.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

#[derive(Default)]
pub struct Seen {
    pub frames: Vec<Frame>,
    /// The server closed (EOF or reset).
    pub closed: bool,
}

pub struct RawH2 {
    pub stream: TcpStream,
    pub seen: Arc<Mutex<Seen>>,
}

impl RawH2 {
    /// Connects, sends the preface and an empty SETTINGS. With `read`, a thread records every
    /// frame the server sends; without, nobody reads (to see whether the server backs off).
    pub fn connect(addr: SocketAddr, read: bool) -> RawH2 {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut client = RawH2 {
            stream,
            seen: Arc::default(),
        };
        client
            .stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .unwrap();
        client.send(SETTINGS, 0, 0, &[]).unwrap();
        if read {
            let mut reader = client.stream.try_clone().unwrap();
            let seen = client.seen.clone();
            std::thread::spawn(move || read_frames(&mut reader, &seen));
        }
        client
    }

    pub fn send(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> std::io::Result<()> {
        self.stream.write_all(&frame(kind, flags, stream, payload))
    }

    /// A GOAWAY's error code, if one arrived.
    pub fn goaway(&self) -> Option<u32> {
        let seen = self.seen.lock().unwrap();
        seen.frames
            .iter()
            .find(|f| f.kind == GOAWAY)
            .map(|f| u32::from_be_bytes(f.payload[4..8].try_into().unwrap()))
    }

    pub fn closed(&self) -> bool {
        self.seen.lock().unwrap().closed
    }

    pub fn frames_of(&self, kind: u8) -> Vec<Frame> {
        let seen = self.seen.lock().unwrap();
        seen.frames
            .iter()
            .filter(|f| f.kind == kind)
            .cloned()
            .collect()
    }
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn read_frames(reader: &mut TcpStream, seen: &Mutex<Seen>) {
    let mut header = [0u8; 9];
    loop {
        if reader.read_exact(&mut header).is_err() {
            break;
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; len];
        if reader.read_exact(&mut payload).is_err() {
            break;
        }
        let stream = u32::from_be_bytes(header[5..9].try_into().unwrap()) & 0x7fff_ffff;
        seen.lock().unwrap().frames.push(Frame {
            kind: header[3],
            flags: header[4],
            stream,
            payload,
        });
    }
    seen.lock().unwrap().closed = true;
}

/// An HPACK block of literal fields without indexing or Huffman coding: simple to write, valid.
pub fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        integer(&mut out, name.len(), 7, 0);
        out.extend_from_slice(name.as_bytes());
        integer(&mut out, value.len(), 7, 0);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// HPACK integer with an `prefix`-bit prefix (RFC 7541 §5.1).
pub fn integer(out: &mut Vec<u8>, mut value: usize, prefix: u8, flags: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

/// The headers of a GET of `path`.
pub fn get(path: &str) -> Vec<u8> {
    hpack(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
    ])
}
