#include "proto/ws_handshake.hpp"

// SHA1() in OpenSSL 3 goes through EVP_Q_digest: it fetches the algorithm and allocates three
// times per call (measured: 3 allocations, ~720 ns). The low-level SHA1_Init/Update/Final are
// deprecated but allocate nothing and take ~140 ns, and an upgrade is on the accept path.
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>

#include "proto/detail/fixed_writer.hpp"

namespace wspush::proto {
namespace {

constexpr std::string_view k_guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
constexpr char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// base64 of a 20-byte digest: six full groups and one 2-byte group with one '='.
void base64_digest(const unsigned char (&d)[20], std::span<char, accept_key_size> out) noexcept {
  std::size_t o = 0;
  for (std::size_t i = 0; i < 18; i += 3) {
    const std::uint32_t v = std::uint32_t{d[i]} << 16 | std::uint32_t{d[i + 1]} << 8 | d[i + 2];
    out[o++] = k_b64[v >> 18 & 63];
    out[o++] = k_b64[v >> 12 & 63];
    out[o++] = k_b64[v >> 6 & 63];
    out[o++] = k_b64[v & 63];
  }
  const std::uint32_t v = std::uint32_t{d[18]} << 16 | std::uint32_t{d[19]} << 8;
  out[o++] = k_b64[v >> 18 & 63];
  out[o++] = k_b64[v >> 12 & 63];
  out[o++] = k_b64[v >> 6 & 63];
  out[o] = '=';
}

using writer = detail::fixed_writer;

}  // namespace

void compute_accept_key(std::string_view client_key, std::span<char, accept_key_size> out) noexcept {
  SHA_CTX ctx;
  SHA1_Init(&ctx);
  SHA1_Update(&ctx, client_key.data(), client_key.size());
  SHA1_Update(&ctx, k_guid.data(), k_guid.size());
  unsigned char digest[20];
  SHA1_Final(digest, &ctx);
  base64_digest(digest, out);
}

std::size_t encode_switching_protocols(std::string_view client_key, std::span<char> out,
                                       std::string_view extensions) noexcept {
  char accept[accept_key_size];
  compute_accept_key(client_key, accept);
  writer w(out);
  w << "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
    << std::string_view(accept, accept_key_size) << "\r\n";
  if (!extensions.empty()) w << "Sec-WebSocket-Extensions: " << extensions << "\r\n";
  w << "\r\n";
  return w.size();
}

std::size_t encode_http_response_typed(std::uint16_t status, std::string_view content_type, std::span<char> out,
                                       std::string_view body, std::string_view extra_headers) noexcept {
  writer w(out);
  w << "HTTP/1.1 " << std::size_t{status} << " " << status_reason(status) << "\r\n";
  // A 304 has no content, and its Content-Length would have to be the full response's (RFC
  // 9110 §8.6): say neither.
  if (status != 304) w << "Content-Type: " << content_type << "\r\nContent-Length: " << body.size() << "\r\n";
  w << "Connection: close\r\n";
  if (status == 426) w << "Sec-WebSocket-Version: 13\r\n";
  w << extra_headers << "\r\n" << body;
  return w.size();
}

std::size_t encode_http_response(std::uint16_t status, std::span<char> out, std::string_view body,
                                 std::string_view extra_headers) noexcept {
  return encode_http_response_typed(status, "text/plain", out, body, extra_headers);
}

std::string_view status_reason(std::uint16_t status) noexcept {
  switch (status) {
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace wspush::proto
