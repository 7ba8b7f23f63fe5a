//! Raw HTTP/1.1 over a `TcpStream`, for requests no well-behaved client would build: headers
//! that are too big or too many, bytes that are not UTF-8, bodies sent slowly or past a limit.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::helpers::Answer;

/// `host:port` of `http://host:port`.
pub fn authority(address: &str) -> &str {
    address.trim_start_matches("http://").trim_end_matches('/')
}

/// Opens a connection to the server at `address` (`http://host:port`).
pub fn connect(address: &str, limit: Duration) -> TcpStream {
    let stream = TcpStream::connect(authority(address)).expect("connect to the server");
    stream.set_read_timeout(Some(limit)).expect("read timeout");
    stream
        .set_write_timeout(Some(limit))
        .expect("write timeout");
    stream
}

/// Sends `request` whole and reads the answer. A write the server cut short (it answered
/// before reading everything) is not an error: the answer is still read.
pub fn exchange(address: &str, request: &[u8], limit: Duration) -> Result<Answer, String> {
    let mut stream = connect(address, limit);
    let _ = stream.write_all(request);
    read_answer(&mut stream)
}

/// Reads one answer: the head, then a `Content-Length` or chunked body, or up to the close.
pub fn read_answer(stream: &mut TcpStream) -> Result<Answer, String> {
    let mut data = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = find(&data, b"\r\n\r\n") {
            break at;
        }
        match stream.read(&mut buffer) {
            Ok(0) => return Err(format!("closed before an answer ({} bytes)", data.len())),
            Ok(n) => data.extend_from_slice(&buffer[..n]),
            Err(e) => return Err(format!("no answer: {e}")),
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {head:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = data[head_end + 4..].to_vec();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let chunked = header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let length: Option<usize> = header("content-length").and_then(|v| v.parse().ok());
    loop {
        let complete = match (length, chunked) {
            (Some(length), _) => body.len() >= length,
            (None, true) => find(&body, b"0\r\n\r\n").is_some(),
            (None, false) => false,
        };
        if complete {
            break;
        }
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&buffer[..n]),
            Err(e) => return Err(format!("the body did not come: {e}")),
        }
    }
    if chunked {
        body = unchunk(&body);
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn unchunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = find(data, b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..line_end])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        out.extend_from_slice(&data[start..(start + size).min(data.len())]);
        data = &data[(start + size + 2).min(data.len())..];
    }
    out
}

/// A request as bytes: `METHOD path HTTP/1.1`, `Host`, `Connection: close`, the given headers
/// (raw bytes, so they may be anything), a `Content-Length` unless `chunked` headers are given,
/// and the body.
pub fn request(method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out =
        format!("{method} {path} HTTP/1.1\r\nHost: hookbox.test\r\nConnection: close\r\n")
            .into_bytes();
    let mut framed = false;
    for (name, value) in headers {
        framed |= name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !framed {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}
