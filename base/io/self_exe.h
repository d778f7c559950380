// Where the running program's file is (/proc/self/exe): programs and libraries that ship
// beside it (bin/, ../lib) are found from there, wherever the folder was copied to.
#pragma once

#include <string>

namespace baton {

// The program's path; "/proc/self/exe" (which still names it for exec) when unreadable.
std::string SelfExePath();
// The folder holding the program; "" when /proc/self/exe cannot be read.
std::string SelfExeDir();

}  // namespace baton
