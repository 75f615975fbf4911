package proto

//go:generate buf generate
