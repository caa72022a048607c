package usage

import (
	"bytes"
	"errors"
	"io"
	"iter"
	"net/http"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// --- compressed bodies ---

const (
	// maxDecodedBody bounds the decoded bytes of one compressed body. Past it
	// the meter stops decoding and keeps what it had found: it bounds the CPU
	// a decompression bomb can cost on the client path. An embeddings answer
	// for 2048 inputs of 3072 float dimensions is about 130 MB of JSON.
	maxDecodedBody = 256 << 20

	// decodeBuffer is the size of the buffer decoded bytes are read into.
	decodeBuffer = 16 << 10

	// zstdMaxWindow: RFC 9659 limits the window of the "zstd" content
	// coding to 8 MB, and browsers refuse more; so does the meter (a frame
	// written as a single segment has its whole content as its window, so
	// such a frame of more than 8 MiB is refused: unmetered).
	zstdMaxWindow = 8 << 20
)

// coding is a response's Content-Encoding.
//
// Compressed bodies (Content-Encoding gzip, x-gzip, deflate, br, zstd) are
// decoded from the meter's own copy. Decoders pull their input while Write is
// pushed bytes, so each compressed body runs its decoder in a coroutine
// (iter.Pull): Write hands p to the decoder and switches to it on the calling
// goroutine; the decoder runs until it has consumed all of p and asks for more,
// which switches back, and Write returns. There is no buffering of the
// compressed input, no lock, no channel and no second goroutine running
// concurrently: the decoding is done synchronously on the client path and costs
// what decoding len(p) bytes costs, and the decoded bytes are capped per
// response (maxDecodedBody) so that a decompression bomb cannot make a Write
// slow. Finish ends the coroutine (its goroutine exits), so nothing outlives
// Finish. An unknown or layered encoding, or corrupt compressed data, leaves
// the response unmetered; a compressed body cut short (client gone, upstream
// reset) is metered with what was decoded by then.
type coding uint8

const (
	codingIdentity coding = iota
	codingGzip
	codingDeflate
	codingBrotli
	codingZstd
	codingUnsupported
)

// codingOf reads Content-Encoding. Codings applied one over another
// ("gzip, br") are not decoded: such a body is unsupported.
func codingOf(h http.Header) coding {
	c := codingIdentity
	if h == nil {
		return c
	}
	for _, v := range h.Values("Content-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			t := strings.TrimSpace(part)
			var this coding
			switch {
			case t == "" || strings.EqualFold(t, "identity"):
				continue
			case strings.EqualFold(t, "gzip") || strings.EqualFold(t, "x-gzip"):
				this = codingGzip
			case strings.EqualFold(t, "deflate"):
				this = codingDeflate
			case strings.EqualFold(t, "br"):
				this = codingBrotli
			case strings.EqualFold(t, "zstd"):
				this = codingZstd
			default:
				return codingUnsupported
			}
			if c != codingIdentity {
				return codingUnsupported
			}
			c = this
		}
	}
	return c
}

// Unencoded reports whether the body of a message with header h has no
// content coding: no Content-Encoding, or only identity, which a client
// may write and an upstream reads as none.
func Unencoded(h http.Header) bool { return codingOf(h) == codingIdentity }

// errStopped is what the decoder's input returns once the meter has
// stopped the coroutine.
var errStopped = errors.New("usage meter stopped")

// source is the decoder's input: the p of the Write in progress. When it
// is used up, Read suspends the decoder coroutine (yield) until the next Write
// or Finish resumes it.
type source struct {
	p     []byte // the bytes of the Write in progress; nil between Writes
	eof   bool   // Finish was called: no more bytes will come
	yield func(struct{}) bool
}

func (s *source) Read(b []byte) (int, error) {
	for len(s.p) == 0 {
		if s.eof {
			return 0, io.EOF
		}
		if s.yield == nil || !s.yield(struct{}{}) {
			return 0, errStopped
		}
	}
	n := copy(b, s.p)
	s.p = s.p[n:]
	return n, nil
}

// decoding is the state of a compressed body's decoder coroutine.
type decoding struct {
	src     source
	next    func() (struct{}, bool) // resumes the decoder coroutine
	stop    func()                  // ends it
	decoded int64                   // decoded bytes so far
}

// decodeMore hands p to the decoder coroutine, starting it on the first
// Write, and returns once the decoder has consumed all of p.
func (m *Meter) decodeMore(p []byte) {
	if m.dec == nil {
		m.dec = new(decoding)
		m.dec.next, m.dec.stop = iter.Pull(m.decode)
	}
	d := m.dec
	d.src.p = p
	_, running := d.next()
	d.src.p = nil // p is not retained
	if !running {
		// The decoder ended (its stream's end, an error, or the cap): the
		// rest of the body is not read. Finish still stops the coroutine.
		m.stopped = true
	}
}

// decode is the decoder coroutine: it decodes the body and feeds the decoded
// bytes to the scanner until its input ends or fails.
func (m *Meter) decode(yield func(struct{}) bool) {
	d := m.dec
	d.src.yield = yield
	defer func() {
		d.src.yield = nil
		if r := recover(); r != nil {
			m.panicked = r
			m.failed = true
		}
	}()
	dec, closeDec, err := newDecoder(m.coding, &d.src)
	if closeDec != nil {
		defer closeDec()
	}
	if err != nil {
		m.decodeFailed(err)
		return
	}
	buf := make([]byte, decodeBuffer)
	for idle := 0; idle < 100; {
		n, err := dec.Read(buf)
		if n > 0 {
			d.decoded += int64(n)
			if d.decoded > maxDecodedBody {
				return // keep what was found: see maxDecodedBody
			}
			m.feed(buf[:n])
		}
		if err != nil {
			m.decodeFailed(err)
			return
		}
		if n == 0 {
			idle++ // a decoder that neither progresses nor fails is given up
		} else {
			idle = 0
		}
	}
}

// decodeFailed classifies the error that ended decoding: the stream's end,
// or the body cut short after Finish, keep what was found; anything else is
// corrupt data and leaves the response unmetered.
func (m *Meter) decodeFailed(err error) {
	switch {
	case err == io.EOF, errors.Is(err, errStopped):
	case m.dec.src.eof && errors.Is(err, io.ErrUnexpectedEOF):
	case m.coding == codingBrotli && err.Error() == brotliExcessInput:
		// The brotli stream reached its end: all of it was decoded. The
		// decoder says so with this error when bytes follow the end, and
		// also, wrongly, when the stream came in very small reads (its
		// internal bit buffer is then left non-empty at the end).
	default:
		m.failed = true
	}
}

// brotliExcessInput is the message of andybalholm/brotli's unexported
// errExcessiveInput.
const brotliExcessInput = "brotli: excessive input"

// newDecoder returns a reader of the decoded body and what releases it.
func newDecoder(c coding, r io.Reader) (io.Reader, func(), error) {
	switch c {
	case codingGzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() { z.Close() }, nil
	case codingDeflate:
		// HTTP's deflate is zlib-wrapped (RFC 9110), but some servers send raw
		// deflate: tell them apart by the zlib header, as browsers do.
		var hdr [2]byte
		n, err := io.ReadFull(r, hdr[:])
		if err != nil {
			if n == 0 && err == io.EOF {
				return nil, nil, io.EOF
			}
			return nil, nil, err
		}
		in := io.MultiReader(bytes.NewReader(hdr[:]), r)
		if isZlibHeader(hdr[0], hdr[1]) {
			z, err := zlib.NewReader(in)
			if err != nil {
				return nil, nil, err
			}
			return z, func() { z.Close() }, nil
		}
		f := flate.NewReader(in)
		return f, func() { f.Close() }, nil
	case codingBrotli:
		return brotli.NewReader(r), nil, nil
	case codingZstd:
		d, err := zstd.NewReader(r,
			zstd.WithDecoderConcurrency(1), // decode on the calling goroutine
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(zstdMaxWindow),
			zstd.WithDecoderMaxMemory(zstdMaxWindow))
		if d == nil {
			return nil, nil, err
		}
		return d, d.Close, err
	}
	return nil, nil, errors.New("unsupported content coding")
}

// isZlibHeader reports whether two bytes open a zlib stream (RFC 1950):
// method 8 (deflate), a window of at most 32 KiB, and a valid check value.
func isZlibHeader(cmf, flg byte) bool {
	return cmf&0x0f == 8 && cmf>>4 <= 7 && (uint16(cmf)<<8|uint16(flg))%31 == 0
}
