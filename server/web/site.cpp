#include "server/web/site.hpp"

namespace wspush::server::web {

site::site() noexcept
    : _index{"text/html; charset=utf-8", assets::index_etag, assets::index_html},
      _module{"text/javascript; charset=utf-8", assets::client_module_etag, assets::client_module},
      _script{"text/javascript; charset=utf-8", assets::client_script_etag, assets::client_script} {}

const static_file* site::find(std::string_view path) const noexcept {
  if (path == "/" || path == "/index.html") return &_index;
  if (path == "/wspush.mjs") return &_module;
  if (path == "/wspush.js") return &_script;
  return nullptr;
}

}  // namespace wspush::server::web
