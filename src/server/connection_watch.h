// Noticing that an HTTP client went away while its request waits in the queue or runs. cpp-httplib 0.11 gives a
// handler no way to ask whether its connection is still open (a streamed write only fails some time after the
// peer closed, and a non-streaming handler writes nothing until the end), so the handler finds its own socket -
// the one whose local and peer addresses are the request's - and polls it for a hang-up.
#pragma once
#include <string>

namespace fern::server {

class ConnectionWatch {
 public:
  // Finds the socket of the connection (remote_addr:remote_port -> local_port). Without one, closed() is false.
  ConnectionWatch(const std::string& remote_addr, int remote_port, int local_port);
  // True when the peer has closed or reset the connection.
  bool closed() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace fern::server
