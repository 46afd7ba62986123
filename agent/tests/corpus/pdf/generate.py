#!/usr/bin/env python3
"""Regenerate the PDF corpus beside this script: one ordinary document and the hostile ones.

Usage: python3 generate.py [OUT_DIR]   (OUT_DIR defaults to this script's folder)

Standard library only, no randomness that is not seeded, no timestamps: running it twice writes
byte-identical files (the compressed files depend on zlib's output, which is stable for a given
zlib; the checked-in files were made with Python 3.11's zlib). Every file stays under 64 KiB.

What each file is, and what a reader of untrusted PDFs should do with it:

  hello-2pages.pdf        Well-formed, 2 pages, Helvetica (WinAnsiEncoding). Page 1 says
                          "Quarterly report" (and "Revenue grew 12 percent"), page 2 says
                          "Second page"; page 2's content stream is FlateDecode-compressed.
  tounicode.pdf           Well-formed, 1 page, a Type0 font with /Encoding /Identity-H and a
                          /ToUnicode CMap (2-byte codes): the text is "Grüße, naïve café — 日本".
                          No font program is embedded (only extraction is exercised).
  encrypted.pdf           hello-2pages.pdf encrypted with the standard security handler, RC4
                          128-bit (V 2, R 3), user password "user", owner password "owner".
                          Without the password: a clear "encrypted" error, no text.
  encrypted-empty-user.pdf  The same with an empty user password (owner password "owner"): any
                          reader opens it without asking, so its text should come out.
  nested-30k-plain.pdf    The catalog carries /Nest, an array nested 30,000 levels deep, written
                          as plain bytes: a recursive-descent parser overflows its stack.
  nested-100k.pdf         An array nested 100,000 levels deep, inside a FlateDecode object stream
                          (PDF 1.5 cross-reference stream), so that 200 KB of brackets fit in a
                          small file. The catalog refers to it.
  nested-content-100k.pdf A page whose (compressed) content stream holds a TJ operand nested
                          100,000 levels deep: the content-stream parser is the one at risk.
  pages-1m.pdf            The page tree claims /Count 1000000: six levels of /Pages nodes with 10
                          kids each, every kid the same node of the level below, down to one
                          /Page. Walking it naively visits 1,000,000 pages made of 8 objects.
  pages-billion-laughs.pdf  The same idea at 2 kids per level over 40 levels: 2^40 page visits
                          for 42 objects (a walker without a global bound never finishes).
  pages-flat-10k.pdf      One /Pages node whose /Kids lists the same /Page 10,000 times
                          (/Count 10000).
  cyclic-pages.pdf        The root /Pages has kids [page, node]; that node's /Kids points back to
                          the root (and to itself): a walker without a visited set loops forever.
  xobject-recursive.pdf   A page that paints a Form XObject which paints itself (/Fm0 Do inside
                          /Fm0), so a text extractor that follows Do recurses without end.
  flate-bomb.pdf          A page whose content stream is FlateDecode twice ([/FlateDecode
                          /FlateDecode]) and inflates to 1 GiB of spaces: decompression must be
                          bounded.
  objstm-amplification.pdf  64 object streams (FlateDecode twice), each inflating to just under
                          1 MiB holding one array of ~500,000 zeros, none of them referenced. Every
                          stream passes a 1 MiB per-stream bound, yet a reader that parses object
                          streams eagerly (lopdf does, at load) builds ~32 million objects: about
                          4 GB of memory from a 4 KB file. Only a bound on the whole process (a
                          child with RLIMIT_AS) contains it; do not load it in a test process.
  truncated.pdf           The first 60% of hello-2pages.pdf (no xref, no trailer).
  garbage.pdf             "%PDF-1.7" followed by 4 KiB of seeded pseudo-random bytes.
"""

import hashlib
import os
import random
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_SIZE = 64 * 1024


# ---------------------------------------------------------------------------------------------
# A tiny PDF writer: objects are bytes (dictionary or array text, or a stream built by stream()).


def stream(dictionary: bytes, data: bytes) -> bytes:
    """A stream object body: `dictionary` is the inside of << >> without /Length."""
    return b"<<" + dictionary + b" /Length %d>>\nstream\n" % len(data) + data + b"\nendstream"


def write_pdf(objects, root=1, extra_trailer=b"", version=b"1.4") -> bytes:
    """Classic cross-reference table. objects: {number: body bytes}, numbered 1..n."""
    out = bytearray(b"%PDF-" + version + b"\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n"
    size = max(objects) + 1
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    for number in range(1, size):
        if number in offsets:
            out += b"%010d 00000 n \n" % offsets[number]
        else:
            out += b"0000000000 65535 f \n"
    out += b"trailer\n<< /Size %d /Root %d 0 R" % (size, root) + extra_trailer + b" >>\n"
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def deflate(data: bytes) -> bytes:
    return zlib.compress(data, 9)


def pdf_string(text: str) -> bytes:
    """A literal string in WinAnsiEncoding (Latin-1 for what we use), escaped."""
    raw = text.encode("cp1252")
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


HELVETICA = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"


# ---------------------------------------------------------------------------------------------
# The ordinary documents.


def hello_objects():
    page1 = (
        b"BT /F1 24 Tf 72 720 Td " + pdf_string("Quarterly report") + b" Tj ET\n"
        b"BT /F1 12 Tf 72 690 Td " + pdf_string("Revenue grew 12 percent") + b" Tj ET\n"
    )
    page2 = b"BT /F1 24 Tf 72 720 Td " + pdf_string("Second page") + b" Tj ET\n"
    return {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R 4 0 R] /Count 2 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 6 0 R >>",
        4: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 7 0 R >>",
        5: HELVETICA,
        6: ("stream", b"", page1),
        7: ("stream", b" /Filter /FlateDecode", deflate(page2)),
    }


def materialize(objects):
    """Turn ("stream", dict, data) entries into stream bodies."""
    return {n: (stream(o[1], o[2]) if isinstance(o, tuple) else o) for n, o in objects.items()}


def hello_2pages() -> bytes:
    return write_pdf(materialize(hello_objects()))


def tounicode() -> bytes:
    text = "Grüße, naïve café — 日本"
    chars = []
    for ch in text:
        if ch not in chars:
            chars.append(ch)
    cid = {ch: i + 1 for i, ch in enumerate(chars)}
    shown = b"<" + b"".join(b"%04X" % cid[ch] for ch in text) + b">"
    mapping = b"".join(
        b"<%04X> <%s>\n" % (cid[ch], ch.encode("utf-16-be").hex().upper().encode()) for ch in chars
    )
    cmap = (
        b"/CIDInit /ProcSet findresource begin\n12 dict begin\nbegincmap\n"
        b"/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def\n"
        b"/CMapName /Adobe-Identity-UCS def\n/CMapType 2 def\n"
        b"1 begincodespacerange\n<0000> <FFFF>\nendcodespacerange\n"
        b"%d beginbfchar\n" % len(chars) + mapping + b"endbfchar\n"
        b"endcmap\nCMapName currentdict /CMap defineresource pop\nend\nend\n"
    )
    content = b"BT /F1 18 Tf 72 720 Td " + shown + b" Tj ET\n"
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 8 0 R >>",
        4: b"<< /Type /Font /Subtype /Type0 /BaseFont /NotoSans /Encoding /Identity-H /DescendantFonts [5 0 R] /ToUnicode 7 0 R >>",
        5: b"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /NotoSans /CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> /FontDescriptor 6 0 R /DW 600 /CIDToGIDMap /Identity >>",
        6: b"<< /Type /FontDescriptor /FontName /NotoSans /Flags 32 /FontBBox [0 -250 1000 900] /ItalicAngle 0 /Ascent 900 /Descent -250 /CapHeight 700 /StemV 80 >>",
        7: stream(b" /Filter /FlateDecode", deflate(cmap)),
        8: stream(b"", content),
    }
    return write_pdf(objects)


# ---------------------------------------------------------------------------------------------
# Encryption: standard security handler, RC4 128-bit, revision 3 (ISO 32000-1, 7.6.3).

PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")
FILE_ID = hashlib.md5(b"agent tests corpus pdf encrypted").digest()


def rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


def padded(password: str) -> bytes:
    return (password.encode("latin-1") + PAD)[:32]


def rc4_rounds(key: bytes, data: bytes) -> bytes:
    """Revision 3's 20 passes: RC4 with key XOR 0, 1, ..., 19."""
    for i in range(20):
        data = rc4(bytes(b ^ i for b in key), data)
    return data


def encrypt_pdf(objects, user: str, owner: str, permissions: int = -4) -> bytes:
    n = 16
    # Algorithm 3: the /O value.
    digest = hashlib.md5(padded(owner)).digest()
    for _ in range(50):
        digest = hashlib.md5(digest[:n]).digest()
    o_value = rc4_rounds(digest[:n], padded(user))
    # Algorithm 2: the file key.
    p_bytes = (permissions & 0xFFFFFFFF).to_bytes(4, "little")
    digest = hashlib.md5(padded(user) + o_value + p_bytes + FILE_ID).digest()
    for _ in range(50):
        digest = hashlib.md5(digest[:n]).digest()
    key = digest[:n]
    # Algorithm 5: the /U value (16 bytes, then 16 arbitrary ones; zeros here).
    u_value = rc4_rounds(key, hashlib.md5(PAD + FILE_ID).digest()) + bytes(16)

    def object_key(number: int) -> bytes:
        return hashlib.md5(key + number.to_bytes(3, "little") + (0).to_bytes(2, "little")).digest()[: min(n + 5, 16)]

    encrypted = {}
    for number, body in objects.items():
        if isinstance(body, tuple):
            encrypted[number] = stream(body[1], rc4(object_key(number), body[2]))
        else:
            encrypted[number] = body  # No strings outside streams in these documents.
    encrypt_number = max(objects) + 1
    encrypted[encrypt_number] = (
        b"<< /Filter /Standard /V 2 /R 3 /Length 128 /P %d /O <%s> /U <%s> >>"
        % (permissions, o_value.hex().upper().encode(), u_value.hex().upper().encode())
    )
    file_id = FILE_ID.hex().upper().encode()
    trailer = b" /Encrypt %d 0 R /ID [<%s> <%s>]" % (encrypt_number, file_id, file_id)
    return write_pdf(encrypted, extra_trailer=trailer)


# ---------------------------------------------------------------------------------------------
# Hostile structure.

CATALOG_AND_ONE_PAGE = {
    1: b"<< /Type /Catalog /Pages 2 0 R >>",
    2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
    3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
    4: stream(b"", b"BT /F1 12 Tf 72 720 Td (still here) Tj ET\n"),
    5: HELVETICA,
}


def nested_plain(depth: int) -> bytes:
    objects = dict(CATALOG_AND_ONE_PAGE)
    objects[1] = b"<< /Type /Catalog /Pages 2 0 R /Nest 6 0 R >>"
    objects[6] = b"[" * depth + b"]" * depth
    return write_pdf(objects)


def nested_object_stream(depth: int) -> bytes:
    """PDF 1.5: objects 1-5 plain, object 6 (the nested array) inside object stream 7, and a
    cross-reference stream (object 8)."""
    out = bytearray(b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n")
    objects = dict(CATALOG_AND_ONE_PAGE)
    objects[1] = b"<< /Type /Catalog /Pages 2 0 R /Nest 6 0 R >>"
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n"
    header = b"6 0 "
    member = b"[" * depth + b"]" * depth
    packed = deflate(header + member)
    offsets[7] = len(out)
    out += b"7 0 obj\n" + stream(b" /Type /ObjStm /N 1 /First %d /Filter /FlateDecode" % len(header), packed) + b"\nendobj\n"
    # Cross-reference stream: W [1 4 2], entries for objects 0..8.
    rows = [b"\x00" + (0).to_bytes(4, "big") + (0xFFFF).to_bytes(2, "big")]
    for number in range(1, 6):
        rows.append(b"\x01" + offsets[number].to_bytes(4, "big") + (0).to_bytes(2, "big"))
    rows.append(b"\x02" + (7).to_bytes(4, "big") + (0).to_bytes(2, "big"))  # 6: in stream 7, index 0
    rows.append(b"\x01" + offsets[7].to_bytes(4, "big") + (0).to_bytes(2, "big"))
    xref_offset = len(out)
    rows.append(b"\x01" + xref_offset.to_bytes(4, "big") + (0).to_bytes(2, "big"))
    data = b"".join(rows)
    out += b"8 0 obj\n" + stream(b" /Type /XRef /Size 9 /W [1 4 2] /Root 1 0 R", data) + b"\nendobj\n"
    out += b"startxref\n%d\n%%%%EOF\n" % xref_offset
    return bytes(out)


def nested_content(depth: int) -> bytes:
    objects = dict(CATALOG_AND_ONE_PAGE)
    content = b"BT /F1 12 Tf 72 720 Td " + b"[" * depth + b"(deep)" + b"]" * depth + b" TJ ET\n"
    objects[4] = stream(b" /Filter /FlateDecode", deflate(content))
    return write_pdf(objects)


def page_dag(fanout: int, levels: int) -> bytes:
    """Catalog 1; /Pages nodes 2..levels+1, each listing the next one `fanout` times; the last
    one lists the single /Page. The root's /Count claims fanout**levels pages."""
    objects = {1: b"<< /Type /Catalog /Pages 2 0 R >>"}
    page = levels + 2
    for level in range(levels):
        number = 2 + level
        child = number + 1
        count = fanout ** (levels - level)
        parent = b"" if level == 0 else b" /Parent %d 0 R" % (number - 1)
        kids = b" ".join([b"%d 0 R" % child] * fanout)
        objects[number] = b"<< /Type /Pages%s /Kids [%s] /Count %d >>" % (parent, kids, count)
    objects[page] = (
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>"
        % (levels + 1, page + 1, page + 2)
    )
    objects[page + 1] = HELVETICA
    objects[page + 2] = stream(b"", b"BT /F1 12 Tf 72 720 Td (one of many) Tj ET\n")
    return write_pdf(objects)


def pages_flat(count: int) -> bytes:
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [" + b" ".join([b"3 0 R"] * count) + b"] /Count %d >>" % count,
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        4: HELVETICA,
        5: stream(b"", b"BT /F1 12 Tf 72 720 Td (the same page) Tj ET\n"),
    }
    return write_pdf(objects)


def cyclic_pages() -> bytes:
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R 4 0 R] /Count 3 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 6 0 R >>",
        4: b"<< /Type /Pages /Parent 2 0 R /Kids [2 0 R 4 0 R 3 0 R] /Count 2 >>",
        5: HELVETICA,
        6: stream(b"", b"BT /F1 12 Tf 72 720 Td (cycle) Tj ET\n"),
    }
    return write_pdf(objects)


def xobject_recursive() -> bytes:
    form = b"BT /F1 12 Tf 72 700 Td (inside the form) Tj ET\n/Fm0 Do\n"
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources 4 0 R /Contents 5 0 R >>",
        4: b"<< /Font << /F1 6 0 R >> /XObject << /Fm0 7 0 R >> >>",
        5: stream(b"", b"BT /F1 12 Tf 72 720 Td (page text) Tj ET\n/Fm0 Do\n"),
        6: HELVETICA,
        7: stream(b" /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources 4 0 R", form),
    }
    return write_pdf(objects)


def flate_bomb(size: int) -> bytes:
    compressor = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    once = bytearray()
    for _ in range(size // len(chunk)):
        once += compressor.compress(chunk)
    once += compressor.flush()
    twice = deflate(bytes(once))
    objects = dict(CATALOG_AND_ONE_PAGE)
    objects[4] = stream(b" /Filter [/FlateDecode /FlateDecode]", twice)
    return write_pdf(objects)


def objstm_amplification(streams: int, size: int) -> bytes:
    """PDF 1.5: objects 1-5 plain; object streams 6, 8, 10, ... each holding one member (7, 9,
    11, ...): an array of zeros `size` bytes long once inflated; a cross-reference stream last."""
    out = bytearray(b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n")
    offsets = {}
    for number in sorted(CATALOG_AND_ONE_PAGE):
        offsets[number] = len(out)
        out += b"%d 0 obj\n" % number + CATALOG_AND_ONE_PAGE[number] + b"\nendobj\n"
    for k in range(streams):
        container = 6 + 2 * k
        header = b"%d 0 " % (container + 1)
        member = b"[" + b"0 " * ((size - len(header) - 2) // 2) + b"]"
        packed = deflate(deflate(header + member))
        offsets[container] = len(out)
        dictionary = b" /Type /ObjStm /N 1 /First %d /Filter [/FlateDecode /FlateDecode]" % len(header)
        out += b"%d 0 obj\n" % container + stream(dictionary, packed) + b"\nendobj\n"
    xref_number = 6 + 2 * streams
    rows = [b"\x00" + bytes(4) + b"\xff\xff"]
    for number in range(1, xref_number):
        if number in offsets:
            rows.append(b"\x01" + offsets[number].to_bytes(4, "big") + bytes(2))
        else:  # a member: in the container just before it, index 0
            rows.append(b"\x02" + (number - 1).to_bytes(4, "big") + bytes(2))
    xref_offset = len(out)
    rows.append(b"\x01" + xref_offset.to_bytes(4, "big") + bytes(2))
    dictionary = b" /Type /XRef /Size %d /W [1 4 2] /Root 1 0 R" % (xref_number + 1)
    out += b"%d 0 obj\n" % xref_number + stream(dictionary, b"".join(rows)) + b"\nendobj\n"
    out += b"startxref\n%d\n%%%%EOF\n" % xref_offset
    return bytes(out)


def truncated() -> bytes:
    whole = hello_2pages()
    return whole[: len(whole) * 6 // 10]


def garbage() -> bytes:
    rng = random.Random(20261127)
    return b"%PDF-1.7\n" + bytes(rng.getrandbits(8) for _ in range(4096))


FILES = {
    "hello-2pages.pdf": hello_2pages,
    "tounicode.pdf": tounicode,
    "encrypted.pdf": lambda: encrypt_pdf(hello_objects(), user="user", owner="owner"),
    "encrypted-empty-user.pdf": lambda: encrypt_pdf(hello_objects(), user="", owner="owner"),
    "nested-30k-plain.pdf": lambda: nested_plain(30_000),
    "nested-100k.pdf": lambda: nested_object_stream(100_000),
    "nested-content-100k.pdf": lambda: nested_content(100_000),
    "pages-1m.pdf": lambda: page_dag(10, 6),
    "pages-billion-laughs.pdf": lambda: page_dag(2, 40),
    "pages-flat-10k.pdf": lambda: pages_flat(10_000),
    "cyclic-pages.pdf": cyclic_pages,
    "xobject-recursive.pdf": xobject_recursive,
    "flate-bomb.pdf": lambda: flate_bomb(1 << 30),
    "objstm-amplification.pdf": lambda: objstm_amplification(64, (1 << 20) - 64),
    "truncated.pdf": truncated,
    "garbage.pdf": garbage,
}


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    os.makedirs(out_dir, exist_ok=True)
    for name, make in FILES.items():
        data = make()
        if len(data) > MAX_SIZE:
            raise SystemExit(f"{name} is {len(data)} bytes, over {MAX_SIZE}")
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
