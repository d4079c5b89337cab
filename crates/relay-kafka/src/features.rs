//! The cluster's finalized feature levels (KIP-584), read with one ApiVersions request
//! (Kafka protocol API key 18, version 3, KIP-511), which librdkafka sends but does not expose:
//! its response carries `FinalizedFeatures` as tagged field 2. `check` uses it to report
//! `transaction.version` (KIP-890 "transactions server-side defense": level 2 is transaction
//! protocol version 2, which librdkafka does not implement).
//!
//! ApiVersions is the one request a broker answers before authentication (clients send it
//! before the SASL handshake), so a plain TCP connection reads it on PLAINTEXT and
//! SASL_PLAINTEXT listeners; TLS listeners (`security.protocol` SSL or SASL_SSL) are not
//! read here.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// ApiVersions' API key.
const API_VERSIONS: i16 = 18;

/// A finalized feature of the cluster: its name and finalized version range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalizedFeature {
    /// The feature (`metadata.version`, `transaction.version`, `group.version`, …).
    pub name: String,
    /// The finalized (highest active) level.
    pub max_level: i16,
    /// The lowest level the cluster still supports.
    pub min_level: i16,
}

/// The finalized features of the first broker of `bootstrap_servers` (comma-separated
/// `host:port`) that answers an ApiVersions v3 request within `timeout`.
///
/// # Errors
/// A text saying why, when no broker answered or the answer could not be read (a broker
/// older than Kafka 2.4 answers ApiVersions v3 with `UNSUPPORTED_VERSION`).
pub fn finalized_features(
    bootstrap_servers: &str,
    timeout: Duration,
) -> Result<Vec<FinalizedFeature>, String> {
    let mut last = String::from("no bootstrap server");
    for server in bootstrap_servers.split(',').map(str::trim) {
        if server.is_empty() {
            continue;
        }
        match ask(server, timeout) {
            Ok(features) => return Ok(features),
            Err(e) => last = format!("{server}: {e}"),
        }
    }
    Err(last)
}

fn ask(server: &str, timeout: Duration) -> Result<Vec<FinalizedFeature>, String> {
    let addr = server
        .to_socket_addrs()
        .map_err(|e| format!("resolving: {e}"))?
        .next()
        .ok_or("no address")?;
    let mut sock = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(timeout))
        .and_then(|()| sock.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    sock.write_all(&api_versions_request(7))
        .map_err(|e| e.to_string())?;
    let mut size = [0u8; 4];
    sock.read_exact(&mut size).map_err(|e| e.to_string())?;
    let size = usize::try_from(i32::from_be_bytes(size)).map_err(|_| "negative size")?;
    if size > 1 << 20 {
        return Err(format!(
            "a response of {size} bytes is not an ApiVersions answer"
        ));
    }
    let mut body = vec![0u8; size];
    sock.read_exact(&mut body).map_err(|e| e.to_string())?;
    parse_api_versions_response(&body)
}

/// An ApiVersions v3 request (size prefix, request header v2, body) with `correlation_id`.
pub fn api_versions_request(correlation_id: i32) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&API_VERSIONS.to_be_bytes());
    m.extend_from_slice(&3i16.to_be_bytes());
    m.extend_from_slice(&correlation_id.to_be_bytes());
    let client = b"outbox-relay-check";
    m.extend_from_slice(&(client.len() as i16).to_be_bytes());
    m.extend_from_slice(client);
    m.push(0); // header tagged fields
    for s in [&b"outbox-relay"[..], env!("CARGO_PKG_VERSION").as_bytes()] {
        m.push((s.len() + 1) as u8); // compact string: length + 1 (short strings)
        m.extend_from_slice(s);
    }
    m.push(0); // body tagged fields
    let mut out = (m.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&m);
    out
}

/// A cursor over a response.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.buf.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn i16(&mut self) -> Result<i16, String> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn uvarint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }
    fn len(&mut self) -> Result<usize, String> {
        // Compact arrays and strings: length + 1 (0 is null).
        let n = self.uvarint()?;
        usize::try_from(n.saturating_sub(1)).map_err(|_| "length too large".into())
    }
    fn skip_tags(&mut self) -> Result<(), String> {
        for _ in 0..self.uvarint()? {
            self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).map_err(|_| "tag too large")?;
            self.take(size)?;
        }
        Ok(())
    }
}

/// The finalized features of an ApiVersions v3 response body (after its size prefix): header
/// v0 (correlation id), error code, the API keys, throttle time, then the tagged fields, of
/// which tag 2 is `FinalizedFeatures` (name, max level, min level).
///
/// # Errors
/// A text naming the broker's error code or where the response is malformed.
pub fn parse_api_versions_response(body: &[u8]) -> Result<Vec<FinalizedFeature>, String> {
    let mut r = Reader { buf: body, at: 0 };
    r.take(4)?; // correlation id
    let error = r.i16()?;
    if error != 0 {
        return Err(format!(
            "the broker answered ApiVersions v3 with error code {error}{}",
            if error == 35 {
                " (UNSUPPORTED_VERSION: a broker older than Kafka 2.4, no feature levels)"
            } else {
                ""
            }
        ));
    }
    for _ in 0..r.len()? {
        r.take(6)?; // api key, min, max
        r.skip_tags()?;
    }
    r.take(4)?; // throttle time
    let mut features = Vec::new();
    for _ in 0..r.uvarint()? {
        let tag = r.uvarint()?;
        let size = usize::try_from(r.uvarint()?).map_err(|_| "tag too large")?;
        let field = r.take(size)?;
        if tag != 2 {
            continue;
        }
        let mut f = Reader { buf: field, at: 0 };
        for _ in 0..f.len()? {
            let n = f.len()?;
            let name = String::from_utf8_lossy(f.take(n)?).into_owned();
            let max_level = f.i16()?;
            let min_level = f.i16()?;
            f.skip_tags()?;
            features.push(FinalizedFeature {
                name,
                max_level,
                min_level,
            });
        }
    }
    Ok(features)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_with_finalized_features_is_read() {
        let mut b = vec![0, 0, 0, 7, 0, 0]; // correlation id 7, no error
        b.push(2); // one API key
        b.extend_from_slice(&[0, 18, 0, 0, 0, 4, 0]);
        b.extend_from_slice(&[0, 0, 0, 0]); // throttle
        b.push(2); // two tagged fields
        b.extend_from_slice(&[1, 8, 0, 0, 0, 0, 0, 0, 0, 9]); // tag 1: epoch 9
        let mut finalized = vec![2]; // one feature
        finalized.push(20);
        finalized.extend_from_slice(b"transaction.version");
        finalized.extend_from_slice(&[0, 2, 0, 0, 0]);
        b.push(2);
        b.push(finalized.len() as u8);
        b.extend_from_slice(&finalized);
        assert_eq!(
            parse_api_versions_response(&b),
            Ok(vec![FinalizedFeature {
                name: "transaction.version".into(),
                max_level: 2,
                min_level: 0,
            }])
        );
        assert!(parse_api_versions_response(&b[..9]).is_err());
        let old = [0, 0, 0, 7, 0, 35, 0, 0, 0, 0];
        assert!(matches!(
            parse_api_versions_response(&old),
            Err(e) if e.contains("UNSUPPORTED_VERSION")
        ));
    }

    #[test]
    fn the_request_is_framed() {
        let r = api_versions_request(7);
        let size = i32::from_be_bytes([r[0], r[1], r[2], r[3]]) as usize;
        assert_eq!(size + 4, r.len());
        assert_eq!(&r[4..8], &[0, 18, 0, 3]);
    }
}
