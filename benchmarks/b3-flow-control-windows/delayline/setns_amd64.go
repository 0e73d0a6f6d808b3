package main

// setns(2); the frozen syscall package does not name it.
const sysSetns = 308
