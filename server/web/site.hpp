#pragma once
// The web floor: the mailbox demo page (`/`) and the JavaScript client (`/wspush.mjs`, the ES
// module; `/wspush.js`, the same source as a classic script setting window.WsPush), built into
// the binary from server/web/ so the server needs no files at run time.

#include <string_view>

#include "server/conn/static_site.hpp"

namespace wspush::server::web {

namespace assets {
extern const std::string_view index_html, index_etag;
extern const std::string_view client_module, client_module_etag;
extern const std::string_view client_script, client_script_etag;
}  // namespace assets

class site final : public static_site {
 public:
  site() noexcept;
  const static_file* find(std::string_view path) const noexcept override;

 private:
  static_file _index, _module, _script;
};

}  // namespace wspush::server::web
