#!/usr/bin/env python3
"""OpenAI-compatible `POST /v1/audio/transcriptions` backed by CMU PocketSphinx.

Test helper for the e2e suite: decodes the upload with ffmpeg to 16 kHz mono
s16le PCM and recognises it with pocketsphinx's bundled US English model.

    python transcribe_server.py --port 0 [--host 127.0.0.1] [--ffmpeg ffmpeg] [--record FILE]

Prints `listening on HOST:PORT` once ready. If TRANSCRIBE_API_KEY is set,
requests must carry `Authorization: Bearer <key>`.
"""
import argparse
import hmac
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pocketsphinx import Decoder

MAX_BODY = 25 * 1024 * 1024
PATH = "/v1/audio/transcriptions"


def parse_multipart(content_type, body):
    """Return {name: (filename, bytes)} for a multipart/form-data body."""
    msg = BytesParser(policy=email_policy).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not msg.is_multipart():
        return {}
    fields = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            fields[name] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # default access log off; see log()
        pass

    def log(self, nbytes, secs, text):
        sys.stderr.write("transcribe %s %s bytes=%d recognise=%.2fs text=%r\n"
                         % (self.command, self.path, nbytes, secs, text))
        sys.stderr.flush()

    def reply(self, status, body, ctype="application/json"):
        if not isinstance(body, bytes):
            body = json.dumps(body).encode() if ctype == "application/json" else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, param=None, code=None, nbytes=0):
        self.log(nbytes, 0.0, "error %d: %s" % (status, message))
        self.reply(status, {"error": {"message": message, "type": "invalid_request_error",
                                      "param": param, "code": code}})

    def do_GET(self):
        self.error(404, "Unknown request URL: GET %s" % self.path)

    def do_POST(self):
        if self.path.split("?")[0] != PATH:
            self.close_connection = True
            return self.error(404, "Unknown request URL: POST %s" % self.path)
        key = os.environ.get("TRANSCRIBE_API_KEY")
        if key and not hmac.compare_digest(self.headers.get("Authorization", "").encode(),
                                           ("Bearer " + key).encode()):
            self.close_connection = True
            return self.error(401, "Incorrect API key provided.", code="invalid_api_key")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            return self.error(411, "Content-Length required")
        if length > MAX_BODY:
            self.close_connection = True
            return self.error(413, "Request body exceeds 25 MiB", param="file", nbytes=length)
        body = self.rfile.read(length)
        fields = parse_multipart(self.headers.get("Content-Type", ""), body)
        value = lambda name: (fields[name][1].decode("utf-8", "replace")
                              if name in fields else None)
        if "file" not in fields or not fields["file"][1]:
            return self.error(400, "Missing required parameter: 'file'.", "file", nbytes=length)
        if not value("model"):
            return self.error(400, "Missing required parameter: 'model'.", "model", nbytes=length)
        filename, audio = fields["file"]
        # A seekable temp file, not a pipe: MP4/M4A may keep their index at the end.
        with tempfile.NamedTemporaryFile(prefix="transcribe-") as tmp:
            tmp.write(audio)
            tmp.flush()
            try:
                pcm = subprocess.run(
                    [self.server.ffmpeg, "-nostdin", "-loglevel", "error", "-i", tmp.name,
                     "-f", "s16le", "-acodec", "pcm_s16le", "-ac", "1", "-ar", "16000",
                     "pipe:1"], capture_output=True, timeout=60, check=True).stdout
            except (subprocess.SubprocessError, OSError):
                pcm = b""
        if not pcm:
            return self.error(400, "Audio file could not be decoded or its format is not"
                              " supported.", "file", nbytes=len(audio))
        start = time.monotonic()
        with self.server.lock:  # one Decoder, not thread-safe
            dec = self.server.decoder
            dec.start_utt()
            dec.process_raw(pcm, full_utt=True)
            dec.end_utt()
            hyp = dec.hyp()
        text = (hyp.hypstr if hyp else "") or ""
        self.log(len(audio), time.monotonic() - start, text)
        if self.server.record:
            rec = {"model": value("model"), "language": value("language"),
                   "prompt": value("prompt"), "bytes": len(audio),
                   "filename": filename, "text": text}
            with self.server.lock, open(self.server.record, "a") as f:
                f.write(json.dumps(rec) + "\n")
        if (value("response_format") or "json") == "text":
            self.reply(200, text + "\n", "text/plain; charset=utf-8")
        else:
            self.reply(200, {"text": text})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--ffmpeg", default="ffmpeg")
    ap.add_argument("--record", help="append one JSON line per transcription")
    args = ap.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.decoder = Decoder(samprate=16000, loglevel="ERROR")
    server.lock = threading.Lock()
    server.ffmpeg, server.record = args.ffmpeg, args.record
    host, port = server.server_address[:2]
    print("listening on %s:%d" % (host, port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
