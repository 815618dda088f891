//! TCP and UDP servers for the stream (layer 4) tests and benchmark.
//!
//! [`TcpEcho`] answers every line it reads with `<port> <line>`, so a
//! client knows which endpoint nginx chose; it can first read a PROXY
//! protocol header and keep it. [`TcpEcho::bench`] is the benchmark's
//! upstream: it echoes one byte and closes, or (see [`sink_transfer`])
//! discards a counted transfer and acknowledges it. [`UdpEcho`] answers each
//! datagram with `<port> <data>`. Every server stops, and its threads are
//! joined, when its handle drops.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a [`TcpEcho`] does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Each line is answered with `<port> <line>`.
    Lines,
    /// The first line is a PROXY protocol header, kept; then [`Mode::Lines`].
    ProxyHeader,
    /// A connection whose first byte is [`SINK`] is a sink: an 8-byte
    /// big-endian count N follows, then N bytes it discards; it writes the
    /// count back, and waits for the next count until EOF. Any other first
    /// byte is echoed, and the server closes the connection.
    Bench,
}

/// Accepting threads of a [`TcpEcho::bench`] server.
const BENCH_ACCEPTORS: usize = 4;

/// The first byte of a sink transfer to a [`TcpEcho::bench`] server.
pub const SINK: u8 = b'S';

/// A TCP server on loopback (see the module's documentation).
pub struct TcpEcho {
    /// `127.0.0.1` or `::1`.
    pub address: String,
    pub port: u16,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    connections: Arc<AtomicUsize>,
    headers: Arc<Mutex<Vec<String>>>,
}

impl TcpEcho {
    /// Line echo on 127.0.0.1, on a free port.
    pub fn start() -> TcpEcho {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), Mode::Lines).unwrap()
    }

    /// Line echo on `[::1]`; the error when IPv6 loopback is unavailable.
    pub fn start_v6() -> io::Result<TcpEcho> {
        Self::start_on(IpAddr::V6(Ipv6Addr::LOCALHOST), Mode::Lines)
    }

    /// Line echo after a PROXY protocol header, which it keeps (see
    /// [`TcpEcho::proxy_headers`]).
    pub fn start_proxy_protocol() -> TcpEcho {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), Mode::ProxyHeader).unwrap()
    }

    /// One-byte echo or counted sink on 127.0.0.1, by the first byte of
    /// each connection (see [`Mode::Bench`] and [`sink_transfer`]).
    pub fn bench() -> TcpEcho {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), Mode::Bench).unwrap()
    }

    fn start_on(ip: IpAddr, mode: Mode) -> io::Result<TcpEcho> {
        let mut last = None;
        // A free port on IPv4 is almost always free on [::1] too; a few tries.
        let (listener, port) = (0..20)
            .find_map(|_| {
                let port = crate::free_port();
                match TcpListener::bind(SocketAddr::new(ip, port)) {
                    Ok(l) => Some((l, port)),
                    Err(e) => {
                        last = Some(e);
                        None
                    }
                }
            })
            .ok_or_else(|| last.unwrap())?;
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let headers = Arc::new(Mutex::new(Vec::new()));
        // The benchmark's server answers on a few accepting threads, each
        // serving its connection itself: a thread spawned per connection
        // would cost more than nginx's share of a short connection. The
        // tests' servers give every connection a thread of its own, so
        // that held connections never block others.
        let acceptors = if mode == Mode::Bench { BENCH_ACCEPTORS } else { 1 };
        let mut threads = Vec::new();
        for _ in 0..acceptors {
            let listener = listener.try_clone()?;
            let (stop, connections, headers) = (stop.clone(), connections.clone(), headers.clone());
            threads.push(std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    connections.fetch_add(1, Ordering::Relaxed);
                    if mode == Mode::Bench {
                        let _ = serve(stream, mode, port, &headers);
                    } else {
                        let headers = headers.clone();
                        std::thread::spawn(move || {
                            let _ = serve(stream, mode, port, &headers);
                        });
                    }
                }
            }));
        }
        Ok(TcpEcho {
            address: ip.to_string(),
            port,
            stop,
            threads,
            connections,
            headers,
        })
    }

    /// `{"address": .., "port": ".."}` as ingress-nginx sends it.
    pub fn endpoint(&self) -> serde_json::Value {
        serde_json::json!({"address": self.address, "port": self.port.to_string()})
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// The PROXY protocol headers read so far, without their CRLF.
    pub fn proxy_headers(&self) -> Vec<String> {
        self.headers.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, mode: Mode, port: u16, headers: &Mutex<Vec<String>>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut out = stream.try_clone()?;
    match mode {
        Mode::Bench => {
            let mut input = stream;
            let mut first = [0u8; 1];
            if input.read(&mut first)? == 0 {
                return Ok(());
            }
            if first[0] == SINK {
                return sink(&mut input, &mut out);
            }
            // Echo it and close first: the TIME_WAIT stays on this side, so
            // the connecting sides (nginx, the client) never run short of
            // ephemeral ports over many thousands of connections.
            out.write_all(&first)?;
            out.shutdown(Shutdown::Write)
        }
        Mode::Lines | Mode::ProxyHeader => {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            if mode == Mode::ProxyHeader {
                if reader.read_line(&mut line)? == 0 {
                    return Ok(());
                }
                headers
                    .lock()
                    .unwrap()
                    .push(line.trim_end_matches(['\r', '\n']).to_string());
                line.clear();
            }
            while reader.read_line(&mut line)? > 0 {
                out.write_all(format!("{port} {}\n", line.trim_end_matches(['\r', '\n'])).as_bytes())?;
                line.clear();
            }
            Ok(())
        }
    }
}

/// The sink side of [`sink_transfer`], after its first byte.
fn sink(input: &mut TcpStream, out: &mut TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let mut count = [0u8; 8];
        match input.read_exact(&mut count) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut left = u64::from_be_bytes(count);
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = input.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            left -= n as u64;
        }
        out.write_all(&count)?;
    }
}

impl Drop for TcpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake each accepting thread; it sees the flag and returns.
        let ip: IpAddr = self.address.parse().unwrap();
        for _ in &self.threads {
            let _ = TcpStream::connect_timeout(&SocketAddr::new(ip, self.port), Duration::from_secs(1));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One line through a line-echo server behind `port` (nginx or the server
/// itself), from `source` if given (a loopback address to bind the client
/// to): the answer without its newline, or the error (EOF included, as
/// `UnexpectedEof`). Bounded by `timeout` per step.
pub fn ask_tcp(port: u16, source: Option<Ipv4Addr>, message: &str, timeout: Duration) -> io::Result<String> {
    let stream = connect_from(port, source)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    (&stream).write_all(format!("{message}\n").as_bytes())?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 || !line.ends_with('\n') {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let _ = stream.shutdown(Shutdown::Both);
    Ok(line.trim_end().to_string())
}

/// A TCP connection to `127.0.0.1:port`, from `source` (any port) if
/// given. On loopback a connect completes or is refused at once.
pub fn connect_from(port: u16, source: Option<Ipv4Addr>) -> io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(("127.0.0.1", port));
    };
    // std has no bind-before-connect; do it with libc, then hand the fd over.
    // SAFETY: plain socket(2); the fd is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns; the TcpStream closes it.
    let stream = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let sin = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let local = sin(source, 0);
    // SAFETY: `local` is a valid sockaddr_in of `len` bytes.
    if unsafe { libc::bind(fd, std::ptr::from_ref(&local).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let remote = sin(Ipv4Addr::LOCALHOST, port);
    // SAFETY: `remote` is a valid sockaddr_in of `len` bytes.
    if unsafe { libc::connect(fd, std::ptr::from_ref(&remote).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

/// The endpoint port an answer `<port> <message>` names.
pub fn answered_by(answer: &str) -> Option<u16> {
    answer.split_once(' ')?.0.parse().ok()
}

/// Sends `bytes` (in 256 KiB writes) through a new connection `stream` to
/// a [`TcpEcho::bench`] server, after [`SINK`] and their count, and waits
/// for the acknowledgement.
pub fn sink_transfer(stream: &mut TcpStream, bytes: u64) -> io::Result<()> {
    stream.write_all(&[SINK])?;
    stream.write_all(&bytes.to_be_bytes())?;
    let chunk = vec![0x5au8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        stream.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    let mut ack = [0u8; 8];
    stream.read_exact(&mut ack)?;
    if u64::from_be_bytes(ack) != bytes {
        return Err(io::Error::other("the sink acknowledged another count"));
    }
    Ok(())
}

/// A UDP server on 127.0.0.1 answering each datagram with `<port> <data>`.
pub struct UdpEcho {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    datagrams: Arc<AtomicUsize>,
}

impl UdpEcho {
    pub fn start() -> UdpEcho {
        let (socket, port) = loop {
            let port = crate::free_port();
            if let Ok(s) = UdpSocket::bind(("127.0.0.1", port)) {
                break (s, port);
            }
        };
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let datagrams = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, datagrams) = (stop.clone(), datagrams.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while !stop.load(Ordering::Acquire) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    datagrams.fetch_add(1, Ordering::Relaxed);
                    let mut reply = format!("{port} ").into_bytes();
                    reply.extend_from_slice(&buf[..n]);
                    let _ = socket.send_to(&reply, from);
                }
            })
        };
        UdpEcho {
            port,
            stop,
            thread: Some(thread),
            datagrams,
        }
    }

    pub fn endpoint(&self) -> serde_json::Value {
        serde_json::json!({"address": "127.0.0.1", "port": self.port.to_string()})
    }

    /// Datagrams received so far.
    pub fn datagrams(&self) -> usize {
        self.datagrams.load(Ordering::Relaxed)
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One datagram to `127.0.0.1:port` from a fresh socket, and the answer
/// (bounded by `timeout`).
pub fn ask_udp(port: u16, message: &str, timeout: Duration) -> io::Result<String> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(("127.0.0.1", port))?;
    socket.send(message.as_bytes())?;
    let mut buf = [0u8; 65536];
    let n = socket.recv(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A port that is free for UDP and TCP on 127.0.0.1 (for a `listen ... udp`).
pub fn free_udp_port() -> u16 {
    loop {
        let port = crate::free_port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
