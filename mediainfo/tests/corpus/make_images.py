"""Writes the image samples of this corpus (see README.md). Deterministic: no randomness."""

import math
import struct
import zlib

from PIL import Image, ImageDraw


def opaque_png(path):
    # 1600x1200 gradient with a few shapes: compresses to a few tens of KB as PNG, so an
    # 800x600 JPEG thumbnail is clearly smaller than the original.
    w, h = 1600, 1200
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = (x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h))
    d = ImageDraw.Draw(img)
    d.ellipse((300, 200, 900, 800), fill=(240, 200, 40))
    d.rectangle((1000, 500, 1500, 1100), fill=(30, 60, 160))
    # A patch of noise, which PNG cannot compress (a deterministic generator, not `random`).
    state = 1
    for y in range(100, 130):
        for x in range(100, 320):
            state = (state * 1103515245 + 12345) % 2**31
            px[x, y] = (state >> 7 & 255, state >> 15 & 255, state >> 23 & 255)
    img.save(path, optimize=True)


def photo_jpeg(path):
    # 2000x1500 smooth "photo" at quality 75.
    w, h = 2000, 1500
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            v = math.sin(x / 150.0) * math.cos(y / 110.0)
            px[x, y] = (int(128 + 100 * v), int(90 + 60 * math.sin(y / 300.0)), 160)
    img.save(path, quality=75, optimize=True)


def transparent_png(path):
    # 2000x1500, fully transparent background with an opaque disc and a half-transparent band.
    w, h = 2000, 1500
    img = Image.new("RGBA", (w, h), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.ellipse((400, 250, 1400, 1250), fill=(200, 30, 30, 255))
    d.rectangle((0, 600, 2000, 900), fill=(20, 120, 220, 128))
    img.save(path, optimize=True)


def chunk(kind, data):
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def bomb_png(path):
    # A valid PNG header declaring 30000x30000 RGB (2.7 GB decoded); the IDAT holds only the
    # first 16 rows of zeros, so the file is a few hundred bytes.
    w = h = 30000
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    rows = (b"\x00" + b"\x00" * (w * 3)) * 16
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    data += chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    opaque_png("opaque.png")
    photo_jpeg("photo.jpg")
    transparent_png("transparent.png")
    bomb_png("bomb.png")
