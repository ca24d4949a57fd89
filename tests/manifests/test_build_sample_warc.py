from warcio.archiveiterator import ArchiveIterator

from manifests import build_sample_warc as warc


def test_rebuild_is_byte_identical_to_committed_file(tmp_path):
    out = tmp_path / warc.DEFAULT_OUT.name
    warc.build(out)
    assert out.read_bytes() == warc.DEFAULT_OUT.read_bytes()


def test_responses_carry_the_bundled_pages():
    statuses = {}
    with open(warc.DEFAULT_OUT, "rb") as stream:
        for record in ArchiveIterator(stream):
            if record.rec_type != "response":
                continue
            uri = record.rec_headers.get_header("WARC-Target-URI")
            statuses[uri] = record.http_headers.get_statuscode()
            body = record.content_stream().read()
            if statuses[uri] == "200":
                rel = uri[len(warc.URL_PREFIX):]
                assert body == (warc.PAGES_DIR / rel).read_bytes()
    assert sum(code == "200" for code in statuses.values()) == warc.N_PAGES
    assert statuses[warc.NOT_FOUND_URI] == "404"
    assert statuses[warc.REDIRECT_URI] == "301"
