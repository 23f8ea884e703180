#pragma once
/// The dashboard page served at `GET /`: serving/dashboard/index.html, embedded into the binary
/// when CMake configures (no build step, nothing fetched from elsewhere at run time).
#include <string_view>

namespace mesh::serving {

/// The page's HTML, with its CSS and JavaScript inline.
std::string_view dashboard_html();

}  // namespace mesh::serving
