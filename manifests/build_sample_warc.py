"""Write manifests/sample/warc/sample.warc.gz from bundled python-docs pages.

The WARC holds a warcinfo record, one HTTP response record per chosen page
(WARC-Target-URI https://docs.python.org/3.11/<relpath>, status 200), plus
one 404 and one 301 response, so the WARC ingestion path meets real pages and
the non-200 records it must skip. The pages are also in the python-docs
source on purpose: the same page reached by two routes is a cross-source
exact duplicate the dedup stage has to catch.

The bytes are reproducible: a fixed WARC-Date, record ids derived from the
target URI (uuid5), pages chosen by a fixed stride over sorted paths, and
gzip members written with mtime 0 by warcio.

    python -m manifests.build_sample_warc [--out manifests/sample/warc/sample.warc.gz]
"""
from __future__ import annotations

import argparse
import io
import uuid
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

PACKAGE_DIR = Path(__file__).resolve().parent
PAGES_DIR = PACKAGE_DIR / "sample" / "python-docs"
DEFAULT_OUT = PACKAGE_DIR / "sample" / "warc" / "sample.warc.gz"
URL_PREFIX = "https://docs.python.org/3.11/"
WARC_DATE = "2023-02-08T00:00:00Z"        # Python 3.11.2 release day
HTTP_DATE = "Wed, 08 Feb 2023 00:00:00 GMT"
N_PAGES = 20
NOT_FOUND_URI = URL_PREFIX + "library/no-such-module.html"
REDIRECT_URI = "https://docs.python.org/3.11"
NOT_FOUND_BODY = (b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>"
                  b"<body><h1>Not Found</h1></body></html>\n")


def chosen_pages(pages_dir: Path = PAGES_DIR, n_pages: int = N_PAGES) -> list[str]:
    pages = sorted(p.relative_to(pages_dir).as_posix() for p in pages_dir.rglob("*.html"))
    stride = max(1, len(pages) // n_pages)
    return pages[::stride][:n_pages]


def record_id(uri: str, record_type: str) -> str:
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, record_type + ' ' + uri)}>"


def _response(writer: WARCWriter, uri: str, status: str, body: bytes,
              extra_headers: list[tuple[str, str]] = ()) -> None:
    http_headers = StatusAndHeaders(status, [
        ("Date", HTTP_DATE),
        ("Server", "nginx"),
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Length", str(len(body))),
        *extra_headers,
    ], protocol="HTTP/1.1")
    record = writer.create_warc_record(
        uri, "response", payload=io.BytesIO(body), http_headers=http_headers,
        warc_headers_dict={"WARC-Record-ID": record_id(uri, "response"),
                           "WARC-Date": WARC_DATE})
    writer.write_record(record)


def build(out: Path = DEFAULT_OUT, pages_dir: Path = PAGES_DIR) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    pages = chosen_pages(pages_dir)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as stream:
        writer = WARCWriter(stream, gzip=True, warc_version="1.1")
        info = (f"software: hymo manifests.build_sample_warc\r\n"
                f"format: WARC File Format 1.1\r\n"
                f"description: {len(pages)} pages of the Python 3.11.2 documentation "
                f"(Debian python3.11-doc), PSF-2.0\r\n").encode("utf-8")
        writer.write_record(writer.create_warc_record(
            "", "warcinfo", payload=io.BytesIO(info),
            warc_content_type="application/warc-fields",
            warc_headers_dict={"WARC-Record-ID": record_id(out.name, "warcinfo"),
                               "WARC-Date": WARC_DATE,
                               "WARC-Filename": out.name}))
        for rel in pages:
            _response(writer, URL_PREFIX + rel, "200 OK", (pages_dir / rel).read_bytes())
        _response(writer, NOT_FOUND_URI, "404 Not Found", NOT_FOUND_BODY)
        _response(writer, REDIRECT_URI, "301 Moved Permanently", b"",
                  [("Location", URL_PREFIX)])
    tmp.replace(out)
    return len(pages)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the sample WARC file.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    print(f"wrote {build(args.out)} pages (+ 404, 301) to {args.out}")


if __name__ == "__main__":
    main()
