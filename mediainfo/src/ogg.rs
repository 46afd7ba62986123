//! Ogg pages (RFC 3533), read by hand: a page is a 27-byte header, a lacing table and at most
//! 65,025 bytes of body, so every buffer here has a fixed bound whatever the file says.
//!
//! The `ogg` crate would do the same, but it keeps a packet that spans pages in memory until
//! it ends, without a bound; a hostile file can make that packet as long as the file.

use std::collections::VecDeque;
use std::io::{self, Read, Seek, SeekFrom};

/// The four bytes every page starts with.
const CAPTURE: &[u8; 4] = b"OggS";
const HEADER_LEN: usize = 27;
/// The largest page: header, 255 lacing values, 255 segments of 255 bytes.
pub(crate) const MAX_PAGE: usize = HEADER_LEN + 255 + 255 * 255;
/// Packets longer than this are dropped whole. Opus audio packets are at most a few KB
/// (RFC 6716 §3.4: 120 ms of 1275-byte frames); only a tags packet with cover art is larger,
/// and it is not needed.
const MAX_PACKET: usize = 64 * 1024;
/// Header flag: this page begins a logical stream.
pub(crate) const FLAG_BOS: u8 = 0x02;
/// Header flag: the first packet on this page continues one from the previous page.
const FLAG_CONTINUED: u8 = 0x01;
/// The granule position meaning "no packet ends on this page".
const NO_GRANULE: i64 = -1;

/// One page's header fields that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageHeader {
    pub flags: u8,
    pub granule: i64,
    pub serial: u32,
}

/// Parses and checks the page starting at `buf[0]`; returns its header and total length.
/// `None` when the bytes are not a whole, intact page (wrong magic, cut off, bad CRC).
pub(crate) fn parse_page(buf: &[u8]) -> Option<(PageHeader, usize)> {
    let head = buf.get(..HEADER_LEN)?;
    if &head[..4] != CAPTURE || head[4] != 0 {
        return None;
    }
    let segments = usize::from(head[26]);
    let lacing = buf.get(HEADER_LEN..HEADER_LEN + segments)?;
    let body: usize = lacing.iter().map(|&l| usize::from(l)).sum();
    let total = HEADER_LEN + segments + body;
    let page = buf.get(..total)?;
    let stored = u32::from_le_bytes([head[22], head[23], head[24], head[25]]);
    if crc(page) != stored {
        return None;
    }
    let mut granule = [0u8; 8];
    granule.copy_from_slice(&head[6..14]);
    Some((
        PageHeader {
            flags: head[5],
            granule: i64::from_le_bytes(granule),
            serial: u32::from_le_bytes([head[14], head[15], head[16], head[17]]),
        },
        total,
    ))
}

/// Reads pages one after another and reassembles the packets of one logical stream: the
/// stream of the first page (the others of a multiplexed file are skipped).
pub(crate) struct PacketReader<R> {
    reader: R,
    /// The current page, then the packets joined across pages, appended after it.
    page: Vec<u8>,
    /// The first page's header, once read.
    first: Option<PageHeader>,
    /// Packets read but not yet returned, as ranges of `page`.
    pending: VecDeque<(usize, usize)>,
    /// The start of a packet that continues on the next page.
    partial: Vec<u8>,
    /// The open packet is being dropped (too long, or its start was lost).
    discarding: bool,
}

impl<R: Read> PacketReader<R> {
    pub(crate) fn new(reader: R) -> Self {
        PacketReader {
            reader,
            page: Vec::with_capacity(MAX_PAGE),
            first: None,
            pending: VecDeque::new(),
            partial: Vec::new(),
            discarding: false,
        }
    }

    /// The first page's header, once the first packet has been asked for.
    pub(crate) fn first_page(&self) -> Option<PageHeader> {
        self.first
    }

    /// The next whole packet of the stream, or `None` at the end of the file or at the first
    /// damaged page (the packets before it were good and stay counted).
    pub(crate) fn next_packet(&mut self) -> io::Result<Option<&[u8]>> {
        loop {
            if let Some((start, end)) = self.pending.pop_front() {
                return Ok(Some(&self.page[start..end]));
            }
            if !self.read_page()? {
                return Ok(None);
            }
        }
    }

    /// Reads pages until one of the followed stream yields at least one whole packet.
    fn read_page(&mut self) -> io::Result<bool> {
        loop {
            self.page.resize(HEADER_LEN, 0);
            if !fill(&mut self.reader, &mut self.page[..])? || &self.page[..4] != CAPTURE {
                return Ok(false);
            }
            let segments = usize::from(self.page[26]);
            self.page.resize(HEADER_LEN + segments, 0);
            if !fill(&mut self.reader, &mut self.page[HEADER_LEN..])? {
                return Ok(false);
            }
            let body: usize = self.page[HEADER_LEN..]
                .iter()
                .map(|&l| usize::from(l))
                .sum();
            let body_start = self.page.len();
            self.page.resize(body_start + body, 0);
            if !fill(&mut self.reader, &mut self.page[body_start..])? {
                return Ok(false);
            }
            let Some((header, _)) = parse_page(&self.page) else {
                return Ok(false);
            };
            if header.serial != self.first.get_or_insert(header).serial {
                continue;
            }
            self.split_packets(header.flags & FLAG_CONTINUED != 0, body_start);
            if !self.pending.is_empty() {
                return Ok(true);
            }
        }
    }

    /// Queues the packets that end on the current page; keeps the start of one that does not.
    fn split_packets(&mut self, continued: bool, body_start: usize) {
        if !continued {
            // A packet left open by the previous page never ended: it is lost.
            self.partial.clear();
            self.discarding = false;
        } else if self.partial.is_empty() {
            // The page continues a packet whose start we never saw.
            self.discarding = true;
        }
        let mut start = body_start;
        let mut end = body_start;
        for i in HEADER_LEN..body_start {
            let len = usize::from(self.page[i]);
            end += len;
            if len == 255 {
                continue;
            }
            if self.discarding {
                self.discarding = false;
            } else if self.partial.is_empty() {
                if end - start <= MAX_PACKET {
                    self.pending.push_back((start, end));
                }
            } else if self.partial.len() + (end - start) <= MAX_PACKET {
                let joined = self.page.len();
                let tail = start..end;
                self.page.extend_from_slice(&self.partial);
                self.page.extend_from_within(tail);
                self.pending.push_back((joined, self.page.len()));
            }
            self.partial.clear();
            start = end;
        }
        if start < end && !self.discarding {
            // The last packet goes on past this page.
            if self.partial.len() + (end - start) <= MAX_PACKET {
                self.partial.extend_from_slice(&self.page[start..end]);
            } else {
                self.partial.clear();
                self.discarding = true;
            }
        }
    }
}

/// Fills `buf` from `reader`; false when the file ends first.
fn fill<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(error) => Err(error),
    }
}

/// The granule position of the last intact page of stream `serial` that has one, found by
/// reading only the end of the file (a page is at most [`MAX_PAGE`] bytes, so the last one
/// starts within the last two pages' worth).
pub(crate) fn last_granule<R: Read + Seek>(
    reader: &mut R,
    file_size: u64,
    serial: u32,
) -> io::Result<Option<i64>> {
    let window = (2 * MAX_PAGE) as u64;
    let start = file_size.saturating_sub(window);
    reader.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::with_capacity(2 * MAX_PAGE);
    reader.take(window).read_to_end(&mut tail)?;
    let mut found = None;
    let mut at = 0;
    while let Some(offset) = find(&tail[at..], CAPTURE) {
        let here = at + offset;
        match parse_page(&tail[here..]) {
            Some((header, len)) => {
                if header.serial == serial && header.granule != NO_GRANULE {
                    found = Some(header.granule);
                }
                at = here + len;
            }
            None => at = here + 1,
        }
    }
    Ok(found)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Ogg's CRC-32: polynomial 0x04c11db7, not reflected, initial value 0, computed with the CRC
/// field itself taken as zero.
fn crc(page: &[u8]) -> u32 {
    let mut crc = 0u32;
    for (i, &byte) in page.iter().enumerate() {
        let byte = if (22..26).contains(&i) { 0 } else { byte };
        crc = (crc << 8) ^ CRC_TABLE[usize::from(((crc >> 24) as u8) ^ byte)];
    }
    crc
}

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut r = (i as u32) << 24;
        let mut bit = 0;
        while bit < 8 {
            r = if r & 0x8000_0000 != 0 {
                (r << 1) ^ 0x04c1_1db7
            } else {
                r << 1
            };
            bit += 1;
        }
        table[i] = r;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    /// One page with a correct CRC, carrying `segments` (lacing values) of `body`.
    fn page(flags: u8, granule: i64, serial: u32, lacing: &[u8], body: &[u8]) -> Vec<u8> {
        let mut page = b"OggS\x00".to_vec();
        page.push(flags);
        page.extend_from_slice(&granule.to_le_bytes());
        page.extend_from_slice(&serial.to_le_bytes());
        page.extend_from_slice(&[0; 8]); // sequence number, CRC
        page.push(u8::try_from(lacing.len()).expect("at most 255 segments"));
        page.extend_from_slice(lacing);
        page.extend_from_slice(body);
        let crc = crc(&page);
        page[22..26].copy_from_slice(&crc.to_le_bytes());
        page
    }

    fn packets(file: &[u8]) -> Vec<Vec<u8>> {
        let mut reader = PacketReader::new(file);
        let mut out = Vec::new();
        while let Some(p) = reader.next_packet().expect("in memory") {
            out.push(p.to_vec());
        }
        out
    }

    #[test]
    fn packets_are_joined_across_pages_and_other_streams_skipped() {
        let long: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut file = page(FLAG_BOS, 0, 7, &[3, 255], &[b"abc", &long[..255]].concat());
        file.extend(page(FLAG_BOS, 0, 9, &[2], b"zz"));
        file.extend(page(
            FLAG_CONTINUED,
            960,
            7,
            &[45, 1],
            &[&long[255..], &b"d"[..]].concat(),
        ));
        assert_eq!(packets(&file), vec![b"abc".to_vec(), long, b"d".to_vec()]);
        assert_eq!(parse_page(&file).map(|(h, _)| h.serial), Some(7));
        let len = file.len() as u64;
        let granule = last_granule(&mut io::Cursor::new(&file), len, 7).expect("in memory");
        assert_eq!(granule, Some(960));
    }

    #[test]
    fn a_packet_that_never_ends_is_dropped_within_bounds() {
        let body = vec![0x55u8; 255 * 255];
        let mut file = page(FLAG_BOS, 0, 1, &[5], b"first");
        for _ in 0..40 {
            file.extend(page(FLAG_CONTINUED, -1, 1, &[255; 255], &body));
        }
        file.extend(page(
            FLAG_CONTINUED,
            0,
            1,
            &[10, 4],
            &[&[0u8; 10][..], b"last"].concat(),
        ));
        let mut reader = PacketReader::new(&file[..]);
        let mut got = Vec::new();
        while let Some(p) = reader.next_packet().expect("in memory") {
            got.push(p.to_vec());
            assert!(reader.partial.capacity() <= 2 * MAX_PACKET);
        }
        assert_eq!(got, vec![b"first".to_vec(), b"last".to_vec()]);
    }

    #[test]
    fn a_damaged_page_ends_the_stream() {
        let mut file = page(FLAG_BOS, 0, 1, &[3], b"one");
        let mut second = page(0, 0, 1, &[3], b"two");
        second[30] ^= 1;
        file.extend(second);
        assert_eq!(packets(&file), vec![b"one".to_vec()]);
    }
}
