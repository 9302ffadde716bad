#pragma once
// Writes a file so that readers see the old one or the whole new one, never a part: a
// unique temporary in the target's directory, written, fsync'ed, renamed over the target,
// and the directory fsync'ed. Local to the report until the project has one helper.
#include <string>
#include <string_view>

namespace zp::report {

// Whether `path` can be written, checked before the work that produces it: its
// directory exists and is writable, and the path is not a directory or a device.
// InputError naming `flag` and the path otherwise. Writes nothing.
void check_writable(const std::string& path, const std::string& flag);

// InputError naming `flag` and the path (with the system's reason) when any step fails;
// the temporary is removed and the target left as it was.
void write_file_atomically(const std::string& path, std::string_view content, const std::string& flag);

}  // namespace zp::report
