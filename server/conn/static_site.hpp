#pragma once
// Files the public listener serves to plain GET requests (the demo page and the JavaScript
// client, built into the binary by server/web/). The connection layer answers them itself, with
// an ETag and a conditional 304; it knows nothing of what they hold.

#include <string_view>

namespace wspush::server {

struct static_file {
  std::string_view content_type;  ///< e.g. "text/html; charset=utf-8"
  std::string_view etag;          ///< quoted, as sent in the ETag header
  std::string_view body;          ///< static storage
};

class static_site {
 public:
  virtual ~static_site() = default;
  /// The file served at `path` (the request target without its query), or null.
  virtual const static_file* find(std::string_view path) const noexcept = 0;
};

}  // namespace wspush::server
