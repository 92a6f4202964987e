// Fuzz target for the inflate path of permessage-deflate (proto::message_inflater), as the
// WebSocket phase drives it: a client's compressed message inflated within a limit. Input: two
// bytes of limit (big-endian, 0..65535), then the message's payload as sent. Invariants: no
// crash, no read or write outside the buffers (the inflater writes its tail behind the payload);
// an inflated message is at most the limit, fits exactly that limit and not one byte less, and
// comes back the same after the server's own deflate; a message too big for the limit is bigger
// than the limit under a larger one (or turns out bad further on), never smaller.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.hpp"
#include "proto/ws_deflate.hpp"

using namespace wspush::proto;

namespace {

inflate_status inflate(message_inflater& z, const std::uint8_t* data, std::size_t size, std::size_t limit,
                       std::vector<std::uint8_t>& out) {
  std::vector<std::uint8_t> in(size + inflate_tail_room);  // exactly the room it may use
  if (size) std::memcpy(in.data(), data, size);
  out.assign(limit, 0);
  std::size_t n = limit + 1;
  const inflate_status st = z.inflate(in, size, out, n);
  if (st == inflate_status::ok) WSPUSH_FUZZ_CHECK(n <= limit);
  out.resize(st == inflate_status::ok ? n : 0);
  return st;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  static message_inflater z;
  static message_deflater d;
  WSPUSH_FUZZ_CHECK(z && d);
  const std::size_t limit = std::size_t(data[0]) << 8 | data[1];
  data += 2, size -= 2;

  std::vector<std::uint8_t> out, again;
  const inflate_status st = inflate(z, data, size, limit, out);
  WSPUSH_FUZZ_CHECK(st <= inflate_status::bad_data);
  if (st == inflate_status::ok) {
    const std::size_t n = out.size();
    WSPUSH_FUZZ_CHECK(inflate(z, data, size, n, again) == inflate_status::ok && again == out);
    if (n > 0) WSPUSH_FUZZ_CHECK(inflate(z, data, size, n - 1, again) == inflate_status::too_big);
    // The server's deflate of it reads back the same.
    std::vector<std::uint8_t> packed(d.bound(n));
    const std::size_t m = d.deflate(out, packed);
    WSPUSH_FUZZ_CHECK(m > 0);
    WSPUSH_FUZZ_CHECK(inflate(z, packed.data(), m, n, again) == inflate_status::ok && again == out);
  } else if (st == inflate_status::too_big) {
    const inflate_status wider = inflate(z, data, size, 1 << 20, again);
    WSPUSH_FUZZ_CHECK(wider != inflate_status::ok || again.size() > limit);
  }
  return 0;
}
